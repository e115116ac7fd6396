"""The test suite's stand-in for CuPy + NCCL on CPU ranks; two models, chosen at import.

- the **strict** model (default, ``_strict.py``): what CuPy 14 on a GPU does where it matters
  for correctness -- streams queue their work and run it only when synchronised or waited on
  through an event, a per-stream memory pool reuses freed blocks at once, arrays cannot be
  converted to host implicitly, events time only what ran, device mismatches are refused and
  NCCL calls complete on their stream. Code with a stream race gives a wrong result here.
- the **permissive** model (``FAKE_CUPY_PERMISSIVE=1``, ``_permissive.py``): arrays are numpy
  arrays underneath and everything happens at once. Only for rank scripts that run Chainer
  itself next to the stand-in (Chainer's own array code needs numpy underneath).

Either module replaces this package in ``sys.modules`` (so ``import cupy`` gives it).
"""

from __future__ import annotations

import importlib
import os
import sys

_impl = importlib.import_module(
    "cupy._permissive" if os.environ.get("FAKE_CUPY_PERMISSIVE") == "1" else "cupy._strict"
)
sys.modules["cupy"] = _impl
