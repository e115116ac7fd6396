"""``tests`` is a regular package: a distribution that installs a top-level ``tests`` package
(several ML libraries ship one) must not shadow it, or collection fails on
``from tests.support...``. And nothing outside the suite (``bench/``, ``scripts/``, ``testkit/``)
imports it."""

from __future__ import annotations

import ast
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


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (imports inside functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def _imports_tests(module: str) -> bool:
    return module == "tests" or module.startswith("tests.")


def test_bench_scripts_and_testkit_do_not_import_the_tests() -> None:
    """Benchmarks and scripts are not tests: what they share with the tests lives in
    ``testkit/`` (or, bench-only, ``bench/_support/``), so the suite stays free to change."""
    sources = [
        path
        for folder in ("bench", "scripts", "testkit")
        for path in sorted((REPO / folder).rglob("*.py"))
    ]
    assert len(sources) > 10
    importing = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in sources
        for module in _imported_modules(path)
        if _imports_tests(module)
    ]
    assert importing == []


def test_the_import_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    script = tmp_path / "bench_like.py"
    script.write_text(
        "import os\n\ndef main():\n    from tests.support.mpirun import run_ranks\n"
        "    import tests\n    from testkit.ranks import mpi_env\n",
        encoding="utf-8",
    )
    modules = _imported_modules(script)
    assert [m for m in modules if _imports_tests(m)] == ["tests.support.mpirun", "tests"]
