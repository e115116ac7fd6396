"""CuPy side of :mod:`mnify.runtime.kernels`: launches the CUDA kernels of this package.

Imported only when a CuPy array reaches the kernel API, so CPU ranks never need CuPy. Works
with CuPy 13 and 14 and numpy 1 and 2 (only ``RawModule``, ``ndarray`` and numpy scalars as
kernel arguments are used). Modules are compiled once per device (CuPy also keeps compiled
code on disk) and the small index tables the kernels read are cached, keyed on the arrays'
addresses and sizes and on the stream, so a training loop's repeated calls cost one launch and
no host copies. A table is uploaded on the stream whose kernels read it and allocated from that
stream's pool, so stream order covers both the upload and the table's reuse after eviction:
new addresses (Chainer hands new gradient arrays every step) cost an upload, never a host wait.
Semantics are those documented in :mod:`mnify.runtime.kernels`; the numpy twins in
:mod:`mnify.runtime.kernels.host` are the reference.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import cupy  # type: ignore[import-not-found]
import numpy as np

from mnify.runtime.kernels import plans, sources
from mnify.runtime.kernels.host import accumulate_dtype

_FLOAT_NAMES = frozenset(sources.FLOAT_CTYPES)
COPY_THREADS = 256

_modules: dict[tuple[int, str], Any] = {}
_functions: dict[tuple[int, str, str], Any] = {}
_sm_counts: dict[int, int] = {}
_PLAN_CACHE_SIZE = 64
_bucket_plans: OrderedDict[tuple[Any, ...], _BucketPlan] = OrderedDict()
_channel_tables: OrderedDict[tuple[Any, ...], tuple[Any, Any]] = OrderedDict()


def _device_id() -> int:
    return int(cupy.cuda.Device().id)


def kernel(source: str, name: str) -> Any:
    """The compiled kernel ``name`` (a name expression from :mod:`sources`) on this device."""
    dev = _device_id()
    key = (dev, source, name)
    fn = _functions.get(key)
    if fn is None:
        module = _modules.get((dev, source))
        if module is None:
            module = cupy.RawModule(
                code=sources.read_source(source),
                name_expressions=sources.NAME_EXPRESSIONS[source],
            )
            _modules[(dev, source)] = module
        fn = module.get_function(name)
        _functions[key] = fn
    return fn


def compile_all() -> list[str]:
    """Compile every kernel on the current device (a warm-up, and a check for ``doctor``)."""
    names = []
    for source, exprs in sources.NAME_EXPRESSIONS.items():
        for expr in exprs:
            kernel(source, expr)
            names.append(expr)
    return names


def sm_count() -> int:
    """Streaming multiprocessors of the current device (sizes grids to fill it)."""
    dev = _device_id()
    count = _sm_counts.get(dev)
    if count is None:
        props = cupy.cuda.runtime.getDeviceProperties(dev)
        count = int(props.get("multiProcessorCount", 80))
        _sm_counts[dev] = count
    return count


def _stream_ptr() -> int:
    return int(cupy.cuda.get_current_stream().ptr)


def _remember(cache: OrderedDict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any) -> None:
    cache[key] = value
    if len(cache) > _PLAN_CACHE_SIZE:
        cache.popitem(last=False)


# ---------------------------------------------------------------------------------------------
# pack / unpack


class _BucketPlan:
    """Device tables for one group of same-dtype arrays: pointers, bucket offsets, tiles."""

    __slots__ = ("ptrs", "offsets", "sizes", "tile_array", "tile_begin", "n_tiles")

    def __init__(self, ptrs: list[int], offsets: list[int], sizes: list[int]) -> None:
        tile_array, tile_begin = plans.bucket_tiles(sizes)
        self.ptrs = cupy.asarray(np.asarray(ptrs, dtype=np.uint64))
        self.offsets = cupy.asarray(np.asarray(offsets, dtype=np.int64))
        self.sizes = cupy.asarray(np.asarray(sizes, dtype=np.int64))
        self.tile_array = cupy.asarray(tile_array)
        self.tile_begin = cupy.asarray(tile_begin)
        self.n_tiles = int(tile_array.size)


def _bucket_plan(items: list[tuple[Any, int]]) -> _BucketPlan:
    ptrs = [int(a.data.ptr) for a, _ in items]
    offsets = [off for _, off in items]
    sizes = [int(a.size) for a, _ in items]
    key = (_device_id(), _stream_ptr(), tuple(ptrs), tuple(offsets), tuple(sizes))
    plan = _bucket_plans.get(key)
    if plan is None:
        plan = _BucketPlan(ptrs, offsets, sizes)  # uploaded on this stream, before its launch
        _remember(_bucket_plans, key, plan)
    else:
        _bucket_plans.move_to_end(key)
    return plan


def _bucket_copy_launches(
    arrays: Sequence[Any], buf: Any, scale: float, to_buffer: bool
) -> list[Callable[[], None]]:
    """The launches that move ``arrays`` to or from ``buf``: one kernel per dtype group, the
    CuPy twins for dtypes without a kernel, then write-backs for strided arrays (unpack).

    Building them costs host time (grouping, table look-ups); calling them costs one launch
    each, which is what :func:`prepare_pack` hands out for replay."""
    groups: dict[str, list[tuple[Any, int]]] = {}
    # strided arrays go through contiguous twins: filled before the kernels (pack) or copied
    # back after them (unpack), on every call
    launches: list[Callable[[], None]] = []
    write_back: list[Callable[[], None]] = []
    offset = 0
    for a in arrays:
        n = int(a.size)
        if n:
            work = a
            if not a.flags.c_contiguous:
                work = cupy.empty(a.shape, dtype=a.dtype)
                if to_buffer:
                    launches.append(functools.partial(work.__setitem__, Ellipsis, a))
                else:
                    write_back.append(functools.partial(a.__setitem__, Ellipsis, work))
            groups.setdefault(np.dtype(a.dtype).name, []).append((work, offset))
        offset += n
    buf_name = np.dtype(buf.dtype).name
    for arr_name, items in groups.items():
        if arr_name not in _FLOAT_NAMES or buf_name not in _FLOAT_NAMES:
            launches.append(functools.partial(_bucket_copy_generic, items, buf, scale, to_buffer))
            continue
        plan = _bucket_plan(items)
        fn = kernel("pack.cu", sources.bucket_copy_name(arr_name, buf_name, to_buffer))
        grid = (min(plan.n_tiles, 65535 * 16),)
        args = (
            plan.ptrs,
            plan.offsets,
            plan.sizes,
            plan.tile_array,
            plan.tile_begin,
            np.int64(plan.n_tiles),
            np.int64(plans.BUCKET_TILE),
            buf,
            np.float64(scale),
        )
        launches.append(functools.partial(fn, grid, (plans.BUCKET_THREADS,), args))
    return launches + write_back


def _bucket_copy(arrays: Sequence[Any], buf: Any, scale: float, to_buffer: bool) -> None:
    """Group arrays by dtype and move each group with one launch (pack or unpack)."""
    for launch in _bucket_copy_launches(arrays, buf, scale, to_buffer):
        launch()


def _bucket_copy_generic(
    items: list[tuple[Any, int]], buf: Any, scale: float, to_buffer: bool
) -> None:
    """Dtypes without a kernel (integers, complex): per-array CuPy ops with the same rule."""
    for a, off in items:
        view = buf[off : off + a.size]
        if to_buffer:
            src = a.reshape(-1) if scale == 1.0 else a.reshape(-1) * scale
            view[...] = src.astype(buf.dtype, copy=False)
        else:
            src = view.reshape(a.shape) if scale == 1.0 else view.reshape(a.shape) * scale
            a[...] = src.astype(a.dtype, copy=False)


def pack(arrays: Sequence[Any], out: Any, scale: float = 1.0) -> None:
    prepare_pack(arrays, out, scale)()


def unpack(buf: Any, arrays: Sequence[Any], scale: float = 1.0) -> None:
    prepare_unpack(buf, arrays, scale)()


def scale(x: Any, factor: float) -> None:
    """In place, one elementwise CuPy kernel: ``x * factor`` computed in the scale dtype (as
    the pack kernel does), cast back once."""
    with x.device:
        work = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)
        # float32 -> float16 into ``out`` is a same-kind cast: CuPy's default casting allows it
        cupy.multiply(x, work.type(factor), out=x, dtype=work)


class _Prepared:
    """Launches built once, run on every call on the device they were built for (the
    current stream at call time). Their tables were uploaded on the stream current when they
    were built: a call on another stream first makes it wait on an event recorded after the
    uploads (no host wait)."""

    def __init__(self, device: Any, launches: list[Callable[[], None]]) -> None:
        self._device, self._launches = device, launches
        self._built_on = _stream_ptr()
        self._uploaded = cupy.cuda.Event(block=False, disable_timing=True)
        self._uploaded.record()

    def __call__(self) -> None:
        with self._device:
            if _stream_ptr() != self._built_on:
                cupy.cuda.get_current_stream().wait_event(self._uploaded)
            for launch in self._launches:
                launch()


def prepare_pack(arrays: Sequence[Any], out: Any, scale: float = 1.0) -> Callable[[], None]:
    with out.device:
        if out.flags.c_contiguous:
            return _Prepared(out.device, _bucket_copy_launches(arrays, out, scale, True))
        # a strided bucket: pack contiguously, then one strided copy
        total = sum(int(a.size) for a in arrays)
        tmp = cupy.empty(total, dtype=out.dtype)
        launches = _bucket_copy_launches(arrays, tmp, scale, True)
        launches.append(functools.partial(out[:total].__setitem__, Ellipsis, tmp))
        return _Prepared(out.device, launches)


def prepare_unpack(buf: Any, arrays: Sequence[Any], scale: float = 1.0) -> Callable[[], None]:
    with buf.device:
        launches: list[Callable[[], None]] = []
        if not buf.flags.c_contiguous:
            contiguous = cupy.empty(buf.shape, dtype=buf.dtype)
            launches.append(functools.partial(contiguous.__setitem__, Ellipsis, buf))
            buf = contiguous
        launches += _bucket_copy_launches(arrays, buf, scale, False)
        return _Prepared(buf.device, launches)


# ---------------------------------------------------------------------------------------------
# batch-norm statistics


def _channel_stats(a: Any, b: Any | None) -> tuple[Any, Any]:
    """Per-channel (sum a, sum a*a) or (sum a, sum a*b): stage 1 kernel + one CuPy reduction."""
    name = np.dtype(a.dtype).name
    acc = accumulate_dtype(a.dtype)
    n, c = int(a.shape[0]), int(a.shape[1])
    s = math.prod(int(d) for d in a.shape[2:])
    if name not in _FLOAT_NAMES:
        return _channel_stats_generic(a, b, acc)
    if n * c * s == 0:
        return cupy.zeros(c, acc), cupy.zeros(c, acc)
    a = cupy.ascontiguousarray(a)
    b = a if b is None else cupy.ascontiguousarray(b)
    two = b is not a
    launch = plans.stats_launch(n, c, s, sm_count())
    parts = launch.parts
    width_s = launch.width
    partial = cupy.empty((2, parts, c * width_s), dtype=acc)
    fn = kernel("channel_stats.cu", sources.channel_sums_name(launch.layout, name, two))
    args: tuple[Any, ...]
    if launch.layout == "rows":
        args = (a, b, np.int64(n), np.int64(c), np.int64(s), np.int64(launch.step), partial)
    else:
        args = (a, b, np.int64(n), np.int64(c * s), np.int64(launch.step), partial)
    fn(launch.grid, launch.block, args)
    if parts == 1 and width_s == 1:
        result = partial.reshape(2, c)
    else:
        result = partial.reshape(2, parts, c, width_s).sum(axis=(1, 3))
    return result[0], result[1]


def _channel_stats_generic(a: Any, b: Any | None, acc: Any) -> tuple[Any, Any]:
    axes = (0, *range(2, a.ndim))
    af = a.astype(acc)
    bf = af if b is None else b.astype(acc)
    return af.sum(axis=axes), (af * bf).sum(axis=axes)


def channel_sums(x: Any) -> tuple[Any, Any]:
    with x.device:
        return _channel_stats(x, None)


def bn_backward_sums(gy: Any, x_hat: Any) -> tuple[Any, Any]:
    with gy.device:
        if gy.dtype != x_hat.dtype:
            wider = np.promote_types(gy.dtype, x_hat.dtype)
            gy, x_hat = gy.astype(wider), x_hat.astype(wider)
        return _channel_stats(gy, x_hat)


# ---------------------------------------------------------------------------------------------
# channel gather / split


def _channel_table(counts: Sequence[int], n: int, s: int) -> tuple[Any, Any]:
    key = (_device_id(), _stream_ptr(), tuple(counts), n, s)
    tables = _channel_tables.get(key)
    if tables is None:
        base, stride = plans.channel_block_tables(counts, n, s)
        tables = (cupy.asarray(base), cupy.asarray(stride))  # on this stream, before its launch
        _remember(_channel_tables, key, tables)
    return tables


def _channel_copy(src: Any, dst: Any, counts: Sequence[int], full_shape: tuple[int, ...]) -> None:
    """Gather (``dst`` is the full tensor) or split (``dst`` is flat); same dtype, contiguous."""
    gather = dst.ndim > 1
    n, channels = full_shape[0], full_shape[1]
    s = math.prod(full_shape[2:])
    total = n * channels * s
    base, stride = _channel_table(counts, n, s)
    wide = total >= 2**31
    index = np.uint64 if wide else np.uint32
    fn = kernel("channels.cu", sources.channel_blocks_name(src.dtype.itemsize, wide, gather))
    grid = max(1, min(-(-total // COPY_THREADS), 32 * sm_count()))
    fn(
        (grid,),
        (COPY_THREADS,),
        (src, dst, base, stride, index(total), index(s), index(channels)),
    )


def _copyable(dtype: Any) -> bool:
    return int(np.dtype(dtype).itemsize) in sources.COPY_CTYPES


def gather_channels(flat: Any, counts: Sequence[int], out: Any) -> None:
    with out.device:
        if not _copyable(flat.dtype):
            _gather_generic(flat, counts, out)
            return
        flat = cupy.ascontiguousarray(flat)
        direct = out.dtype == flat.dtype and out.flags.c_contiguous
        target = out if direct else cupy.empty(out.shape, dtype=flat.dtype)
        _channel_copy(flat, target, counts, tuple(out.shape))
        if not direct:
            out[...] = target


def split_channels(x: Any, counts: Sequence[int], out: Any) -> None:
    with x.device:
        if not _copyable(x.dtype):
            _split_generic(x, counts, out)
            return
        src = cupy.ascontiguousarray(x)
        view = out[: src.size]
        direct = out.dtype == src.dtype and view.flags.c_contiguous
        target = view if direct else cupy.empty(src.size, dtype=src.dtype)
        _channel_copy(src, target, counts, tuple(src.shape))
        if not direct:
            view[...] = target


def _gather_generic(flat: Any, counts: Sequence[int], out: Any) -> None:
    n, spatial = out.shape[0], tuple(out.shape[2:])
    offset = c0 = 0
    for c in counts:
        block = n * c * math.prod(spatial)
        out[:, c0 : c0 + c] = flat[offset : offset + block].reshape((n, c, *spatial))
        offset, c0 = offset + block, c0 + c


def _split_generic(x: Any, counts: Sequence[int], out: Any) -> None:
    n, spatial = x.shape[0], tuple(x.shape[2:])
    offset = c0 = 0
    for c in counts:
        block = n * c * math.prod(spatial)
        out[offset : offset + block] = x[:, c0 : c0 + c].reshape(-1)
        offset, c0 = offset + block, c0 + c


def copy_rows(src: Any, src_start: int, dst: Any, dst_start: int, n_rows: int, axis: int) -> None:
    """The halo row-block copy (see ``halo.cu``); ``dst`` must be C-contiguous."""
    with dst.device:
        src = cupy.ascontiguousarray(src)
        outer = math.prod(src.shape[:axis])
        inner = math.prod(src.shape[axis + 1 :])
        total = outer * n_rows * inner
        if total == 0:
            return
        if not _copyable(src.dtype):
            host_like = dst.reshape(outer, dst.shape[axis], inner)
            block = src.reshape(outer, src.shape[axis], inner)[:, src_start : src_start + n_rows]
            host_like[:, dst_start : dst_start + n_rows] = block
            return
        wide = max(int(src.size), int(dst.size)) >= 2**31
        index = np.uint64 if wide else np.uint32
        fn = kernel("halo.cu", sources.halo_rows_name(src.dtype.itemsize, wide))
        grid = max(1, min(-(-total // COPY_THREADS), 32 * sm_count()))
        args = (outer, src.shape[axis], src_start, dst.shape[axis], dst_start, n_rows, inner)
        fn((grid,), (COPY_THREADS,), (src, dst, *(index(a) for a in args)))
