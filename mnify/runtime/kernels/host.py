"""numpy twins of the CUDA kernels: the same results on CPU ranks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def pack(arrays: Sequence[Any], out: np.ndarray, scale: float = 1.0) -> None:
    offset = 0
    for a in arrays:
        n = a.size
        dst = out[offset : offset + n]
        if scale == 1.0:
            np.copyto(dst, a.reshape(-1), casting="unsafe")
        else:
            np.multiply(a.reshape(-1), scale, out=dst, casting="unsafe")
        offset += n


def unpack(buf: np.ndarray, arrays: Sequence[Any], scale: float = 1.0) -> None:
    offset = 0
    for a in arrays:
        n = a.size
        src = buf[offset : offset + n].reshape(a.shape)
        if scale == 1.0:
            np.copyto(a, src, casting="unsafe")
        else:
            np.multiply(src, scale, out=a, casting="unsafe")
        offset += n
