"""``mnify lint`` on files it cannot read: an ``error:`` line each, a failure line at the end
(never "All checks passed!") and exit 2; files with a PEP 263 coding cookie are read as Python
reads them. Through the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MNIST = REPO / "fixtures" / "convert" / "mnist_mlp.in.py"
MNIFY = Path(sys.executable).parent / "mnify"
CLEAN = b"import chainer\n\nmodel = chainer.links.Linear(3)\n"


def lint(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not MNIFY.exists():
        pytest.skip("mnify is not installed as a console script next to this Python")
    return subprocess.run(
        [str(MNIFY), "lint", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """One clean file, a dangling ``*.py`` link and a ``*.py`` link loop."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "clean.py").write_bytes(CLEAN)
    (root / "dangling.py").symlink_to("missing.py")
    (root / "loop.py").symlink_to("loop.py")
    return root


def test_unreadable_files_end_in_a_failure_line(project: Path) -> None:
    run = lint("project", cwd=project.parent)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert run.stderr.splitlines() == [
        "error: cannot lint project/dangling.py: dangling symbolic link (to missing.py)",
        "error: cannot lint project/loop.py: symbolic link loop",
    ]
    assert run.stdout.splitlines() == [
        "Failed: 2 files could not be linted; no findings in the rest."
    ]


def test_findings_and_unreadable_files_are_both_counted(project: Path) -> None:
    (project / "train.py").write_bytes(MNIST.read_bytes())
    run = lint("project", "missing_dir", cwd=project.parent)
    assert run.returncode == 2
    last = run.stdout.splitlines()[-1]
    assert last.startswith("Found ") and last.endswith("; 3 files could not be linted.")
    assert "All checks passed!" not in run.stdout
    assert len([line for line in run.stderr.splitlines() if line.startswith("error:")]) == 3


def test_a_file_without_a_cookie_that_is_not_utf8_is_a_failure(tmp_path: Path) -> None:
    (tmp_path / "latin.py").write_bytes("import chainer\n# caf\u00e9\n".encode("latin-1"))
    run = lint("latin.py", cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines()[0].startswith("error: cannot lint latin.py: 2:6: not UTF-8")
    assert run.stdout.splitlines() == [
        "Failed: 1 file could not be linted; no findings in the rest."
    ]


@pytest.mark.parametrize(
    ("encoding", "comment"),
    [("latin-1", "# café au lait"), ("shift_jis", "# 学習用スクリプト"), ("euc-jp", "# 学習用")],
)
def test_coding_cookie_files_are_linted_like_their_utf8_twins(
    tmp_path: Path, encoding: str, comment: str
) -> None:
    body = MNIST.read_text(encoding="utf-8").split("\n", 1)[1]
    for name, cookie in (("cookie.py", encoding), ("twin.py", "utf-8")):
        text = f"# -*- coding: {cookie} -*-\n{comment}\n{body}"
        (tmp_path / name).write_bytes(text.encode(cookie))
    findings = {}
    for name in ("cookie.py", "twin.py"):
        run = lint(name, "--output-format", "json", cwd=tmp_path)
        assert run.returncode == 1, run.stderr  # the script has hazards, and no read errors
        assert run.stderr == ""
        findings[name] = [(d["code"], d["line"], d["column"]) for d in json.loads(run.stdout)]
    assert findings["cookie.py"] == findings["twin.py"] != []
