"""Array kernels the communicators and links need, one API for numpy (CPU) and CuPy (GPU).

Each function takes numpy or CuPy arrays and dispatches on the array type: numpy arrays run the
numpy twin in :mod:`mnify.runtime.kernels.host`, CuPy arrays run the CUDA kernels loaded from
this package's ``.cu`` sources (:mod:`mnify.runtime.kernels.device`). Nothing here imports
Chainer. These signatures are a contract other modules rely on; keep them stable.

Gradient buckets (communicators):

``pack(arrays, out, scale=1.0) -> None``
    Copy ``arrays`` (any shapes, any float dtypes, C-contiguous) one after another into the 1-D
    ``out``, cast to ``out.dtype`` and multiplied by ``scale``. ``out`` must hold at least the
    sum of the sizes; the rest is left as it was. On GPU it is one kernel launch for all arrays.
    The product is computed in :func:`scale_dtype` (float64 if either side is float64, else
    float32), then rounded once to the destination dtype, on CPU and GPU alike.
``unpack(buf, arrays, scale=1.0) -> None``
    The inverse: fill ``arrays`` in place from the 1-D ``buf``, cast back, times ``scale``.
``scale(x, factor) -> None``
    ``x`` (any float dtype, any layout) times ``factor`` in place, computed in
    :func:`scale_dtype` and rounded once, as pack's scale is. For a bucket reduced in the
    gradient's own memory: ``unpack(x, [x], factor)`` would hand the pack kernel one buffer
    through two ``__restrict__`` pointers, which CUDA leaves undefined.
``prepare_pack(arrays, out, scale=1.0) -> Callable[[], None]`` and ``prepare_unpack(...)``
    The same work with the host-side preparation (grouping, device tables) done once: each
    call of the result does the copy again with the arrays' current contents, on GPU at the
    cost of one launch per dtype group (what a training loop, a benchmark of the kernel alone,
    or a CUDA graph capture wants).

Batch-norm statistics (MultiNodeBatchNormalization):

``channel_sums(x) -> (sum, sumsq)``
    ``x`` shaped ``(N, C, *spatial)`` (``(N, C)`` too). Returns two 1-D arrays of length C: the
    per-channel sum and sum of squares over every axis but 1, computed in one pass and
    accumulated in :func:`accumulate_dtype` (float32 for float16/float32 input, float64 for
    float64), which is also the dtype of the results.
``bn_backward_sums(gy, x_hat) -> (sum_gy, sum_gy_xhat)``
    Same shapes as above: per-channel ``sum(gy)`` and ``sum(gy * x_hat)``, one pass, results in
    the wider of the two accumulation dtypes.

Channel-parallel convolution (ParallelConvolution2D):

``gather_channels(flat, counts, n, spatial, out=None) -> out``
    ``flat`` is an allgathered rank-major buffer: rank r's block is its own output shaped
    ``(n, counts[r], *spatial)``, C-contiguous, blocks back to back. Writes every block's channels
    into place in ``out`` shaped ``(n, sum(counts), *spatial)`` (allocated with ``flat.dtype``
    when None) and returns it.
``split_channels(x, counts, out=None) -> flat``
    The inverse, for backward: ``x`` shaped ``(n, sum(counts), *spatial)`` becomes the rank-major
    1-D buffer of its channel slices ``x[:, c_r : c_r + counts[r]]`` (each block C-contiguous),
    written into ``out`` (allocated with ``x.dtype`` when None) and returned.

Spatial parallelism (halo exchange of create_spatial_parallel_model):

``halo_pack(x, axis, start, stop) -> block``
    Rows ``start:stop`` of ``x`` along ``axis`` as a new C-contiguous array (a send buffer).
``halo_unpack(pieces, shape, axis, fill, xp) -> out``
    A new C-contiguous array of ``shape`` filled with ``fill`` (the padding), with each
    ``(offset, block)`` of ``pieces`` copied into rows ``offset : offset + block.shape[axis]``.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mnify.runtime import observers
from mnify.runtime.kernels import host
from mnify.runtime.kernels.host import accumulate_dtype, scale_dtype

__all__ = [
    "accumulate_dtype",
    "bn_backward_sums",
    "channel_sums",
    "gather_channels",
    "halo_pack",
    "halo_unpack",
    "pack",
    "prepare_pack",
    "prepare_unpack",
    "scale",
    "scale_dtype",
    "split_channels",
    "unpack",
]


def _is_numpy(x: Any) -> bool:
    return type(x).__module__ == "numpy"


def _device() -> Any:
    """The CUDA side, imported only when a CuPy array arrives (CPU ranks never need CuPy)."""
    return importlib.import_module("mnify.runtime.kernels.device")


def pack(arrays: Sequence[Any], out: Any, scale: float = 1.0) -> None:
    """Copy ``arrays`` one after another into the 1-D ``out``, cast to its dtype, times ``scale``.

    ``out`` must hold at least the sum of the arrays' sizes; the rest is left as it was.
    """
    total = sum(int(a.size) for a in arrays)
    if out.ndim != 1 or out.size < total:
        raise ValueError(f"pack: out must be 1-D with at least {total} elements, got {out.shape}")
    with observers.kernel("pack", out):
        if _is_numpy(out):
            host.pack(arrays, out, scale)
        else:
            _device().pack(arrays, out, scale)


def unpack(buf: Any, arrays: Sequence[Any], scale: float = 1.0) -> None:
    """Inverse of :func:`pack`: fill ``arrays`` in place from ``buf``, cast back, times ``scale``."""
    total = sum(int(a.size) for a in arrays)
    if buf.ndim != 1 or buf.size < total:
        raise ValueError(f"unpack: buf must be 1-D with at least {total} elements, got {buf.shape}")
    with observers.kernel("unpack", buf):
        if _is_numpy(buf):
            host.unpack(buf, arrays, scale)
        else:
            _device().unpack(buf, arrays, scale)


def scale(x: Any, factor: float) -> None:
    """``x`` times ``factor`` in place (the rounding of :func:`pack`'s scale)."""
    if _is_numpy(x):
        host.scale(x, factor)
    else:
        _device().scale(x, factor)


def prepare_pack(arrays: Sequence[Any], out: Any, scale: float = 1.0) -> Callable[[], None]:
    """:func:`pack` prepared once, to be called many times (the arrays' contents may change,
    their memory may not)."""
    total = sum(int(a.size) for a in arrays)
    if out.ndim != 1 or out.size < total:
        raise ValueError(f"pack: out must be 1-D with at least {total} elements, got {out.shape}")
    if _is_numpy(out):
        return functools.partial(host.pack, list(arrays), out, scale)
    prepared: Callable[[], None] = _device().prepare_pack(arrays, out, scale)
    return prepared


def prepare_unpack(buf: Any, arrays: Sequence[Any], scale: float = 1.0) -> Callable[[], None]:
    """:func:`unpack` prepared once, to be called many times."""
    total = sum(int(a.size) for a in arrays)
    if buf.ndim != 1 or buf.size < total:
        raise ValueError(f"unpack: buf must be 1-D with at least {total} elements, got {buf.shape}")
    if _is_numpy(buf):
        return functools.partial(host.unpack, buf, list(arrays), scale)
    prepared: Callable[[], None] = _device().prepare_unpack(buf, arrays, scale)
    return prepared


def channel_sums(x: Any) -> tuple[Any, Any]:
    """Per-channel (sum, sum of squares) of ``x`` shaped (N, C, *spatial), in one pass."""
    if x.ndim < 2:
        raise ValueError(f"channel_sums: expected (N, C, *spatial), got shape {x.shape}")
    if _is_numpy(x):
        return host.channel_sums(x)
    result: tuple[Any, Any] = _device().channel_sums(x)
    return result


def bn_backward_sums(gy: Any, x_hat: Any) -> tuple[Any, Any]:
    """Per-channel (sum(gy), sum(gy * x_hat)) for batch norm's backward, in one pass."""
    if gy.shape != x_hat.shape or gy.ndim < 2:
        raise ValueError(
            f"bn_backward_sums: gy {gy.shape} and x_hat {x_hat.shape} must both be (N, C, ...)"
        )
    if _is_numpy(gy):
        return host.bn_backward_sums(gy, x_hat)
    result: tuple[Any, Any] = _device().bn_backward_sums(gy, x_hat)
    return result


def _empty_like_module(ref: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised array of ``ref``'s kind; on the GPU, on ``ref``'s device (not the
    current one, which may be another)."""
    if _is_numpy(ref):
        return np.empty(shape, dtype=dtype)
    import cupy  # type: ignore[import-not-found]

    with ref.device:
        return cupy.empty(shape, dtype=dtype)


def gather_channels(
    flat: Any, counts: Sequence[int], n: int, spatial: Sequence[int], out: Any = None
) -> Any:
    """Place each rank's (n, counts[r], *spatial) block of the rank-major ``flat`` into ``out``."""
    counts = [int(c) for c in counts]
    spatial = tuple(int(s) for s in spatial)
    shape = (int(n), sum(counts), *spatial)
    need = math.prod(shape)
    if flat.ndim != 1 or flat.size < need:
        raise ValueError(
            f"gather_channels: flat must be 1-D with at least {need} elements, got {flat.shape}"
        )
    if out is None:
        out = _empty_like_module(flat, shape, flat.dtype)
    elif tuple(out.shape) != shape:
        raise ValueError(f"gather_channels: out must be shaped {shape}, got {tuple(out.shape)}")
    if need == 0:
        return out
    if _is_numpy(flat):
        host.gather_channels(flat, counts, out)
    else:
        _device().gather_channels(flat, counts, out)
    return out


def split_channels(x: Any, counts: Sequence[int], out: Any = None) -> Any:
    """Rank-major 1-D buffer of ``x``'s channel slices: the inverse of :func:`gather_channels`."""
    counts = [int(c) for c in counts]
    if x.ndim < 2 or x.shape[1] != sum(counts):
        raise ValueError(
            f"split_channels: x must be (N, {sum(counts)}, *spatial) for counts {counts}, "
            f"got {tuple(x.shape)}"
        )
    need = int(x.size)
    if out is None:
        out = _empty_like_module(x, (need,), x.dtype)
    elif out.ndim != 1 or out.size < need:
        raise ValueError(
            f"split_channels: out must be 1-D with at least {need} elements, got {out.shape}"
        )
    if need == 0:
        return out
    if _is_numpy(x):
        host.split_channels(x, counts, out)
    else:
        _device().split_channels(x, counts, out)
    return out


def _copy_rows(src: Any, src_start: int, dst: Any, dst_start: int, n_rows: int, axis: int) -> None:
    if _is_numpy(dst):
        host.copy_rows(np.ascontiguousarray(src), src_start, dst, dst_start, n_rows, axis)
    else:
        _device().copy_rows(src, src_start, dst, dst_start, n_rows, axis)


def halo_pack(x: Any, axis: int, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of ``x`` along ``axis``, as a new C-contiguous array."""
    if not 0 <= start <= stop <= x.shape[axis]:
        raise ValueError(f"halo_pack: rows {start}:{stop} outside 0:{x.shape[axis]}")
    shape = (*x.shape[:axis], stop - start, *x.shape[axis + 1 :])
    out = _empty_like_module(x, shape, x.dtype)
    _copy_rows(x, start, out, 0, stop - start, axis)
    return out


def halo_unpack(
    pieces: Sequence[tuple[int, Any]], shape: tuple[int, ...], axis: int, fill: float, xp: Any
) -> Any:
    """An array of ``shape`` filled with ``fill``, each ``(offset, block)`` copied into place."""
    out = xp.full(shape, fill, dtype=pieces[0][1].dtype if pieces else np.float32)
    for offset, block in pieces:
        rows = int(block.shape[axis])
        if not 0 <= offset <= offset + rows <= shape[axis]:
            raise ValueError(f"halo_unpack: rows {offset}:{offset + rows} outside 0:{shape[axis]}")
        _copy_rows(block, 0, out, offset, rows, axis)
    return out
