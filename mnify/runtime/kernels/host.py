"""numpy twins of the CUDA kernels: the same results on CPU ranks.

Every function here has the signature and semantics documented in
:mod:`mnify.runtime.kernels`; the GPU versions live in :mod:`mnify.runtime.kernels.device`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def accumulate_dtype(dtype: Any) -> np.dtype[Any]:
    """The dtype channel statistics are accumulated and returned in.

    float16 and float32 inputs accumulate in float32 (as cuDNN does for batch norm), float64 in
    float64; anything else (integers) in float64.
    """
    dt = np.dtype(dtype)
    if dt == np.float16 or dt == np.float32:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def scale_dtype(src: Any, dst: Any) -> np.dtype[Any]:
    """The dtype ``x * scale`` is computed in when packing ``src`` into ``dst`` (or back).

    float64 when either side is float64, float32 otherwise: float16 never does arithmetic in
    float16, and the CUDA kernels use the same rule, so both sides round alike.
    """
    if np.dtype(src) == np.float64 or np.dtype(dst) == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _scaled_copy(src: np.ndarray, dst: np.ndarray, scale: float) -> None:
    if scale == 1.0:
        np.copyto(dst, src, casting="unsafe")
    else:
        work = scale_dtype(src.dtype, dst.dtype)
        np.multiply(src, work.type(scale), out=dst, dtype=work, casting="unsafe")


def scale(x: np.ndarray, factor: float) -> None:
    _scaled_copy(x, x, factor)


def pack(arrays: Sequence[Any], out: np.ndarray, scale: float = 1.0) -> None:
    offset = 0
    for a in arrays:
        n = a.size
        _scaled_copy(a.reshape(-1), out[offset : offset + n], scale)
        offset += n


def unpack(buf: np.ndarray, arrays: Sequence[Any], scale: float = 1.0) -> None:
    offset = 0
    for a in arrays:
        n = a.size
        _scaled_copy(buf[offset : offset + n].reshape(a.shape), a, scale)
        offset += n


def _as_ncs(x: np.ndarray) -> np.ndarray:
    """View (N, C, *spatial) as (N, C, S) in the accumulation dtype (a copy only when casting)."""
    if x.ndim < 2:
        raise ValueError(f"expected an array shaped (N, C, *spatial), got shape {x.shape}")
    n, c = x.shape[0], x.shape[1]
    s = math.prod(x.shape[2:])
    return x.reshape(n, c, s).astype(accumulate_dtype(x.dtype), copy=False)


def channel_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xa = _as_ncs(x)
    total = xa.sum(axis=(0, 2))
    sumsq = np.einsum("ncs,ncs->c", xa, xa)
    return total, sumsq


def bn_backward_sums(gy: np.ndarray, x_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if gy.shape != x_hat.shape:
        raise ValueError(f"gy {gy.shape} and x_hat {x_hat.shape} must have the same shape")
    acc = np.promote_types(accumulate_dtype(gy.dtype), accumulate_dtype(x_hat.dtype))
    g = _as_ncs(gy).astype(acc, copy=False)
    xh = _as_ncs(x_hat).astype(acc, copy=False)
    return g.sum(axis=(0, 2)), np.einsum("ncs,ncs->c", g, xh)


def gather_channels(flat: np.ndarray, counts: Sequence[int], out: np.ndarray) -> None:
    n = out.shape[0]
    spatial = out.shape[2:]
    offset = 0
    c0 = 0
    for c in counts:
        block = n * c * math.prod(spatial)
        out[:, c0 : c0 + c] = flat[offset : offset + block].reshape((n, c, *spatial))
        offset += block
        c0 += c


def split_channels(x: np.ndarray, counts: Sequence[int], out: np.ndarray) -> None:
    n = x.shape[0]
    spatial = x.shape[2:]
    offset = 0
    c0 = 0
    for c in counts:
        block = n * c * math.prod(spatial)
        out[offset : offset + block].reshape((n, c, *spatial))[...] = x[:, c0 : c0 + c]
        offset += block
        c0 += c


def copy_rows(
    src: np.ndarray, src_start: int, dst: np.ndarray, dst_start: int, n_rows: int, axis: int
) -> None:
    """Copy rows ``src_start .. +n_rows`` of ``src`` along ``axis`` to ``dst_start ..`` of ``dst``
    (both C-contiguous, same shape except along ``axis``): the halo pack / unpack copy."""
    outer = math.prod(src.shape[:axis])
    inner = math.prod(src.shape[axis + 1 :])
    s = src.reshape(outer, src.shape[axis], inner)
    d = dst.reshape(outer, dst.shape[axis], inner)
    d[:, dst_start : dst_start + n_rows] = s[:, src_start : src_start + n_rows]
