"""Array kernels the communicators and links need, one API for numpy (CPU) and CuPy (GPU).

Each function takes numpy or CuPy arrays and dispatches on the array type: numpy arrays run the
numpy twin in :mod:`mnify.runtime.kernels.host`, CuPy arrays run the CUDA kernels loaded from
this package's ``.cu`` sources. Nothing here imports Chainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mnify.runtime.kernels import host


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy"


def pack(arrays: Sequence[Any], out: Any, scale: float = 1.0) -> None:
    """Copy ``arrays`` one after another into the 1-D ``out``, cast to its dtype, times ``scale``.

    ``out`` must hold at least the sum of the arrays' sizes; the rest is left as it was.
    """
    if _is_numpy(out):
        host.pack(arrays, out, scale)
    else:
        from mnify.runtime.kernels import device

        device.pack(arrays, out, scale)


def unpack(buf: Any, arrays: Sequence[Any], scale: float = 1.0) -> None:
    """Inverse of :func:`pack`: fill ``arrays`` in place from ``buf``, cast back, times ``scale``."""
    if _is_numpy(buf):
        host.unpack(buf, arrays, scale)
    else:
        from mnify.runtime.kernels import device

        device.unpack(buf, arrays, scale)
