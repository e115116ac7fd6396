"""The test suite's one stand-in for CuPy (and NCCL), for machines without a GPU.

This directory goes first on ``sys.path`` (``PATH``; a subprocess gets it through
``PYTHONPATH``): it then provides ``cupy`` (the stand-in, see ``cupy/__init__.py`` for its modes
and what it models) and ``mnify_fake_device`` (a pytest plugin / import that swaps the CUDA
kernels for their numpy twins). Rank scripts call :func:`use` before they import ``cupy``.
"""

from __future__ import annotations

import sys
from pathlib import Path

PATH = Path(__file__).resolve().parent


def use() -> None:
    """Put the stand-in first on ``sys.path`` (before ``cupy`` is imported)."""
    if str(PATH) not in sys.path:
        sys.path.insert(0, str(PATH))
