"""The test suite's one stand-in for CuPy (and NCCL), for machines without a GPU.

This directory goes first on ``sys.path`` (``PATH``; a subprocess gets it through
``PYTHONPATH``): it then provides ``cupy`` (the stand-in, see ``cupy/__init__.py`` for what it
models) and ``mnify_fake_device`` (a pytest plugin / import that swaps the CUDA
kernels for their numpy twins). Rank scripts call :func:`use` before they import ``cupy``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PATH = Path(__file__).resolve().parent


def use() -> None:
    """Put the stand-in first on ``sys.path`` (before ``cupy`` is imported)."""
    if str(PATH) not in sys.path:
        sys.path.insert(0, str(PATH))


_SMOKE_DRIVER = """
import runpy, sys
sys.path.insert(0, {fake!r})
sys.path.insert(0, {repo!r})
import mnify_fake_device  # the CUDA kernels -> their numpy twins
sys.argv = [{bench!r}, "--smoke", "--json", {out!r}]
runpy.run_path({bench!r}, run_name="__main__")
"""


def run_bench_smoke(
    bench: Path, out: Path, cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a GPU bench script with ``--smoke --json OUT`` on the stand-in, in a fresh
    interpreter (so a GPU session never spends its minutes on a typo)."""
    code = _SMOKE_DRIVER.format(
        fake=str(PATH), repo=str(bench.resolve().parents[1]), bench=str(bench), out=str(out)
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
