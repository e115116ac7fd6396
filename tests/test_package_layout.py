"""``tests`` is a regular package: a distribution that installs a top-level ``tests`` package
(several ML libraries ship one) must not shadow it, or collection fails on
``from tests.support...``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_an_installed_tests_package_does_not_shadow_ours(tmp_path: Path) -> None:
    shadow = tmp_path / "site" / "tests"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("SHADOW = True\n", encoding="utf-8")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            "tests/test_mpirun_helper.py",
        ],
        cwd=REPO,
        env={"PYTHONPATH": str(shadow.parent), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/test_mpirun_helper.py::") for line in collected)


def test_every_directory_with_tests_is_a_package() -> None:
    for test_file in (REPO / "tests").rglob("test_*.py"):
        for directory in test_file.relative_to(REPO).parents:
            if directory != Path("."):
                assert (REPO / directory / "__init__.py").is_file(), directory
