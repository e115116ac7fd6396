"""The lock check (scripts/lock_check.py): CI fails when pyproject.toml and the lock disagree."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def _lock_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock_check", REPO / "scripts" / "lock_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "requirements").mkdir()
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for name in ("build.in", "dev.lock"):
        shutil.copy(REPO / "requirements" / name, tmp_path / "requirements" / name)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_committed_lock_satisfies_pyproject() -> None:
    assert _lock_check().disagreements(REPO) == []


def test_every_pin_carries_hashes_and_chainer_is_its_sdist() -> None:
    text = (REPO / "requirements" / "dev.lock").read_text()
    pins = _lock_check().pins(text)
    assert {"chainer", "pip", "setuptools", "wheel", "mypy", "pytest", "mpi4py"} <= set(pins)
    assert pins["chainer"][0] == "7.8.1"
    assert int(pins["setuptools"][0].split(".")[0]) < 70
    entries = [e for e in text.split("\n") if "==" in e and not e.startswith((" ", "#"))]
    assert len(entries) == len(pins)
    assert text.count("--hash=sha256:") >= len(pins)


def test_a_range_the_lock_does_not_meet_is_named(tree: Path) -> None:
    _edit(tree / "pyproject.toml", '"ruff>=0.6"', '"ruff>=99"')
    (problem,) = _lock_check().disagreements(tree)
    assert problem.startswith("ruff>=99 (pyproject.toml [dev]) is not met by the lock's ruff==")


def test_a_new_requirement_without_a_pin_is_named(tree: Path) -> None:
    _edit(tree / "pyproject.toml", '"click>=8.1",', '"click>=8.1",\n    "attrs>=20",')
    assert _lock_check().disagreements(tree) == [
        "attrs>=20 (pyproject.toml dependencies) has no pin in requirements/dev.lock"
    ]


def test_a_pin_nobody_asks_for_is_named(tree: Path) -> None:
    _edit(tree / "pyproject.toml", '    "rich>=13",\n', "")
    (problem,) = _lock_check().disagreements(tree)
    assert problem.startswith("requirements/dev.lock pins rich==")


def test_markers_are_read_for_the_locks_target(tree: Path) -> None:
    # tomli is only asked for below Python 3.11: the lock (3.11) needs no pin for it
    assert "tomli" not in _lock_check().pins((tree / "requirements" / "dev.lock").read_text())
    assert _lock_check().disagreements(tree) == []
