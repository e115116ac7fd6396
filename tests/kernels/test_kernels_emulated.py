"""pack.cu, channels.cu and halo.cu themselves, compiled for the CPU and run one CUDA thread at a time.

These kernels never synchronise inside a block, so running every (block, thread) in turn is a
faithful execution of their code. g++ builds them with a few macros standing in for CUDA's
keywords and built-ins (float16 conversions use the compiler's IEEE binary16, see common.cu);
the launch shapes and index tables come from plans.py exactly as device.py builds them. Results
must equal the numpy twins bit for bit (float16 included). Skipped without g++.
(channel_stats.cu synchronises threads and is covered by the replay tests and on GPUs.)
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mnify.runtime.kernels import host, plans, sources

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not found: kernels not emulated")

TYPES = {"float16": 0, "float32": 1, "float64": 2}

HARNESS = r"""
#define MNIFY_HOST_EMULATION
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) alignas(n)
struct mn_dim3 { unsigned x, y, z; };
static mn_dim3 blockIdx, threadIdx, blockDim, gridDim;

#include "pack.cu"
#include "channels.cu"
#include "halo.cu"

template <typename Body>
static void launch(unsigned grid, unsigned threads, Body body) {
  gridDim = {grid, 1, 1};
  blockDim = {threads, 1, 1};
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned t = 0; t < threads; ++t) {
      blockIdx = {b, 0, 0};
      threadIdx = {t, 0, 0};
      body();
    }
}

template <typename A, typename B, bool To>
static void copy_bucket(unsigned grid, unsigned threads, const unsigned long long* ptrs,
                        const long long* offsets, const long long* sizes, const int* tile_array,
                        const long long* tile_begin, long long n_tiles, long long tile_elems,
                        void* buffer, double scale) {
  launch(grid, threads, [&] {
    mnify_bucket_copy<A, B, To>(ptrs, offsets, sizes, tile_array, tile_begin, n_tiles,
                                tile_elems, (B*)buffer, scale);
  });
}

template <typename A, bool To>
static void copy_bucket_b(int b, unsigned grid, unsigned threads, const unsigned long long* p,
                          const long long* o, const long long* s, const int* ta,
                          const long long* tb, long long n, long long te, void* buf, double sc) {
  if (b == 0) copy_bucket<A, mn_half, To>(grid, threads, p, o, s, ta, tb, n, te, buf, sc);
  if (b == 1) copy_bucket<A, float, To>(grid, threads, p, o, s, ta, tb, n, te, buf, sc);
  if (b == 2) copy_bucket<A, double, To>(grid, threads, p, o, s, ta, tb, n, te, buf, sc);
}

extern "C" void emulate_bucket_copy(int a, int b, int to_buffer, unsigned grid, unsigned threads,
                                    const unsigned long long* p, const long long* o,
                                    const long long* s, const int* ta, const long long* tb,
                                    long long n, long long te, void* buf, double sc) {
  if (to_buffer) {
    if (a == 0) copy_bucket_b<mn_half, true>(b, grid, threads, p, o, s, ta, tb, n, te, buf, sc);
    if (a == 1) copy_bucket_b<float, true>(b, grid, threads, p, o, s, ta, tb, n, te, buf, sc);
    if (a == 2) copy_bucket_b<double, true>(b, grid, threads, p, o, s, ta, tb, n, te, buf, sc);
  } else {
    if (a == 0) copy_bucket_b<mn_half, false>(b, grid, threads, p, o, s, ta, tb, n, te, buf, sc);
    if (a == 1) copy_bucket_b<float, false>(b, grid, threads, p, o, s, ta, tb, n, te, buf, sc);
    if (a == 2) copy_bucket_b<double, false>(b, grid, threads, p, o, s, ta, tb, n, te, buf, sc);
  }
}

template <typename T, bool Gather>
static void blocks(unsigned grid, unsigned threads, const void* src, void* dst,
                   const long long* base, const long long* stride, unsigned long long total,
                   unsigned long long s, unsigned long long channels, int wide) {
  launch(grid, threads, [&] {
    if (wide)
      mnify_channel_blocks<T, unsigned long long, Gather>((const T*)src, (T*)dst, base, stride,
                                                          total, s, channels);
    else
      mnify_channel_blocks<T, unsigned int, Gather>((const T*)src, (T*)dst, base, stride,
                                                    (unsigned)total, (unsigned)s,
                                                    (unsigned)channels);
  });
}

extern "C" void emulate_channel_blocks(int itemsize, int gather, int wide, unsigned grid,
                                       unsigned threads, const void* src, void* dst,
                                       const long long* base, const long long* stride,
                                       unsigned long long total, unsigned long long s,
                                       unsigned long long channels) {
#define MN_CASE(SIZE, T)                                                                      \
  if (itemsize == SIZE) {                                                                     \
    if (gather) blocks<T, true>(grid, threads, src, dst, base, stride, total, s, channels, wide); \
    else blocks<T, false>(grid, threads, src, dst, base, stride, total, s, channels, wide);    \
  }
  MN_CASE(1, unsigned char)
  MN_CASE(2, unsigned short)
  MN_CASE(4, unsigned int)
  MN_CASE(8, unsigned long long)
#undef MN_CASE
}

template <typename T>
static void halo(unsigned grid, unsigned threads, const void* src, void* dst, int wide,
                 const unsigned long long* a) {
  launch(grid, threads, [&] {
    if (wide)
      mnify_halo_rows<T, unsigned long long>((const T*)src, (T*)dst, a[0], a[1], a[2], a[3],
                                             a[4], a[5], a[6]);
    else
      mnify_halo_rows<T, unsigned int>((const T*)src, (T*)dst, (unsigned)a[0], (unsigned)a[1],
                                       (unsigned)a[2], (unsigned)a[3], (unsigned)a[4],
                                       (unsigned)a[5], (unsigned)a[6]);
  });
}

extern "C" void emulate_halo_rows(int itemsize, int wide, unsigned grid, unsigned threads,
                                  const void* src, void* dst, const unsigned long long* args) {
  if (itemsize == 1) halo<unsigned char>(grid, threads, src, dst, wide, args);
  if (itemsize == 2) halo<unsigned short>(grid, threads, src, dst, wide, args);
  if (itemsize == 4) halo<unsigned int>(grid, threads, src, dst, wide, args);
  if (itemsize == 8) halo<unsigned long long>(grid, threads, src, dst, wide, args);
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ctypes.CDLL]:
    assert GXX is not None
    work = tmp_path_factory.mktemp("emulated")
    src = work / "harness.cpp"
    src.write_text(HARNESS)
    so = work / "harness.so"
    cmd = [GXX, "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{sources.KERNEL_DIR}", "-o", str(so)]
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    yield ctypes.CDLL(str(so))


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _bucket_copy(
    lib: Any, arrays: list[np.ndarray], buf: np.ndarray, scale: float, to: bool
) -> None:
    """device.py's _bucket_copy for one dtype group, with the emulated launch."""
    sizes = [a.size for a in arrays]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    tile_array, tile_begin = plans.bucket_tiles(sizes)
    ptrs = np.array([a.ctypes.data for a in arrays], dtype=np.uint64)
    size_arr = np.asarray(sizes, dtype=np.int64)
    lib.emulate_bucket_copy(
        TYPES[arrays[0].dtype.name],
        TYPES[buf.dtype.name],
        int(to),
        ctypes.c_uint(max(1, tile_array.size)),
        ctypes.c_uint(plans.BUCKET_THREADS),
        _ptr(ptrs),
        _ptr(offsets),
        _ptr(size_arr),
        _ptr(tile_array),
        _ptr(tile_begin),
        ctypes.c_longlong(tile_array.size),
        ctypes.c_longlong(plans.BUCKET_TILE),
        _ptr(buf),
        ctypes.c_double(scale),
    )


FLOATS = [np.float16, np.float32, np.float64]


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", FLOATS)
@pytest.mark.parametrize("scale", [1.0, 1 / 3])
def test_bucket_copy_equals_twin(lib: Any, src: Any, dst: Any, scale: float) -> None:
    rng = np.random.default_rng(0)
    sizes = [3, 2049, 1, 4096, 5]
    arrays = [(rng.standard_normal(n) * 100).astype(src) for n in sizes]
    total = sum(sizes)
    got = np.full(total, 9, dtype=dst)
    _bucket_copy(lib, arrays, got, scale, to=True)
    want = np.full(total, 9, dtype=dst)
    host.pack(arrays, want, scale)
    np.testing.assert_array_equal(got, want)

    back = [np.zeros_like(a) for a in arrays]
    _bucket_copy(lib, back, want, 1 / scale, to=False)
    expect = [np.zeros_like(a) for a in arrays]
    host.unpack(want, expect, 1 / scale)
    for g, e in zip(back, expect, strict=True):
        np.testing.assert_array_equal(g, e)


def test_float16_rounding_and_overflow_like_the_twin(lib: Any) -> None:
    # ties, subnormals, values past float16's range: one rounding, to nearest even
    values = np.array([1 + 2**-11, 1 + 3 * 2**-11, 6e-8, 3e-5, 65519.0, 65520.0, -1e6, 0.1])
    got = np.zeros(values.size, np.float16)
    _bucket_copy(lib, [values], got, 1.0, to=True)
    want = np.zeros(values.size, np.float16)
    with np.errstate(over="ignore"):  # 65520 and -1e6 become infinities, on purpose
        host.pack([values], want, 1.0)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("itemsize_dtype", [np.uint8, np.float16, np.float32, np.float64])
@pytest.mark.parametrize(("counts", "n", "spatial"), [([2, 2, 1], 3, (3, 5)), ([1, 0, 3], 2, (7,))])
@pytest.mark.parametrize("wide", [False, True])
def test_channel_blocks_equal_twin(
    lib: Any, itemsize_dtype: Any, counts: list[int], n: int, spatial: tuple[int, ...], wide: bool
) -> None:
    s = math.prod(spatial)
    full = (np.random.default_rng(1).standard_normal((n, sum(counts), *spatial)) * 50).astype(
        itemsize_dtype
    )
    flat = np.empty(full.size, full.dtype)
    host.split_channels(full, counts, flat)
    base, stride = plans.channel_block_tables(counts, n, s)
    total = full.size
    grid = max(1, min(-(-total // 256), 3))  # few blocks: the grid-stride loop must wrap
    args = (base, stride, total, s, sum(counts))

    gathered = np.zeros_like(full)
    lib.emulate_channel_blocks(
        full.itemsize, 1, int(wide), ctypes.c_uint(grid), ctypes.c_uint(64),
        _ptr(flat), _ptr(gathered), _ptr(args[0]), _ptr(args[1]),
        ctypes.c_ulonglong(total), ctypes.c_ulonglong(s), ctypes.c_ulonglong(args[4]),
    )  # fmt: skip
    np.testing.assert_array_equal(gathered, full)

    split = np.zeros_like(flat)
    lib.emulate_channel_blocks(
        full.itemsize, 0, int(wide), ctypes.c_uint(grid), ctypes.c_uint(64),
        _ptr(full), _ptr(split), _ptr(args[0]), _ptr(args[1]),
        ctypes.c_ulonglong(total), ctypes.c_ulonglong(s), ctypes.c_ulonglong(args[4]),
    )  # fmt: skip
    np.testing.assert_array_equal(split, flat)


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64])
@pytest.mark.parametrize("axis", [2, 3])
@pytest.mark.parametrize("wide", [False, True])
def test_halo_rows_equal_twin(lib: Any, dtype: Any, axis: int, wide: bool) -> None:
    """Packing rows 2:5 of a slab and unpacking them at row 1 of an extended one, as the
    exchange does, equals host.copy_rows (the numpy twin) bit for bit."""
    src = (np.random.default_rng(2).standard_normal((2, 3, 7, 6)) * 50).astype(dtype)
    start, rows, dst_start = 2, 3, 1
    dst_shape = list(src.shape)
    dst_shape[axis] = 5
    outer = math.prod(src.shape[:axis])
    inner = math.prod(src.shape[axis + 1 :])
    args = np.array(
        [outer, src.shape[axis], start, dst_shape[axis], dst_start, rows, inner], dtype=np.uint64
    )
    got = np.zeros(dst_shape, dtype)
    grid = 3  # few blocks: the grid-stride loop must wrap
    lib.emulate_halo_rows(
        src.itemsize, int(wide), ctypes.c_uint(grid), ctypes.c_uint(32), _ptr(src), _ptr(got),
        _ptr(args),
    )  # fmt: skip
    want = np.zeros(dst_shape, dtype)
    host.copy_rows(src, start, want, dst_start, rows, axis)
    np.testing.assert_array_equal(got, want)
    assert np.any(want != 0)


# -- channel_stats.cu: its threads synchronise, so each CUDA thread becomes an OS thread ---------

STATS_HARNESS = r"""
#define MNIFY_HOST_EMULATION
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __shared__ static  /* one block runs at a time: static is the block's shared memory */
#include <barrier>
#include <memory>
#include <thread>
#include <vector>
struct mn_dim3 { unsigned x, y, z; };
static thread_local mn_dim3 threadIdx;
static mn_dim3 blockIdx, blockDim, gridDim;
static std::unique_ptr<std::barrier<>> block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
static double shuffle_lanes[64][32];

static void __syncthreads() { block_barrier->arrive_and_wait(); }

template <typename T> static T __shfl_down_sync(unsigned, T v, int offset) {
  const unsigned linear = threadIdx.x + threadIdx.y * blockDim.x;
  const unsigned warp = linear / 32, lane = linear % 32;
  shuffle_lanes[warp][lane] = (double)v;
  warp_barriers[warp]->arrive_and_wait();
  const T got = lane + offset < 32 ? (T)shuffle_lanes[warp][lane + offset] : v;
  warp_barriers[warp]->arrive_and_wait();
  return got;
}

#include "channel_stats.cu"

template <typename Body>
static void launch(mn_dim3 grid, mn_dim3 block, Body body) {
  gridDim = grid;
  blockDim = block;
  const unsigned threads = block.x * block.y;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      blockIdx = {bx, by, 0};
      block_barrier = std::make_unique<std::barrier<>>(threads);
      warp_barriers.clear();
      for (unsigned w = 0; w < threads / 32; ++w)
        warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          threadIdx = {t % block.x, t / block.x, 0};
          body();
        });
      for (auto& th : pool) th.join();
    }
}

template <typename T, bool Two>
static void stats(int rows, unsigned gx, unsigned gy, const void* a, const void* b, long long n,
                  long long width, long long s, long long step, void* partial) {
  typedef typename mn_acc<T>::type Acc;
  if (rows)
    launch({gx, gy, 1}, {256, 1, 1}, [&] {
      mnify_channel_sums_rows<T, Two>((const T*)a, (const T*)b, n, width, s, step, (Acc*)partial);
    });
  else
    launch({gx, gy, 1}, {32, 8, 1}, [&] {
      mnify_channel_sums_cols<T, Two>((const T*)a, (const T*)b, n, width, step, (Acc*)partial);
    });
}

extern "C" void emulate_channel_sums(int rows, int type, int two, unsigned gx, unsigned gy,
                                     const void* a, const void* b, long long n, long long width,
                                     long long s, long long step, void* partial) {
#define MN_CASE(CODE, T)                                                          \
  if (type == CODE) {                                                             \
    if (two) stats<T, true>(rows, gx, gy, a, b, n, width, s, step, partial);      \
    else stats<T, false>(rows, gx, gy, a, b, n, width, s, step, partial);         \
  }
  MN_CASE(0, mn_half)
  MN_CASE(1, float)
  MN_CASE(2, double)
#undef MN_CASE
}
"""


@pytest.fixture(scope="module")
def stats_lib(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ctypes.CDLL]:
    assert GXX is not None
    work = tmp_path_factory.mktemp("emulated_stats")
    src = work / "stats.cpp"
    src.write_text(STATS_HARNESS)
    so = work / "stats.so"
    cmd = [GXX, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", f"-I{sources.KERNEL_DIR}"]
    proc = subprocess.run(
        [*cmd, "-o", str(so), str(src)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0 and "barrier" in proc.stderr:
        pytest.skip(f"this g++ has no C++20 <barrier>: {proc.stderr[:200]}")
    assert proc.returncode == 0, proc.stderr
    yield ctypes.CDLL(str(so))


def _emulated_stats(
    lib: Any, a: np.ndarray, b: np.ndarray | None, sm_count: int
) -> tuple[Any, Any]:
    """device.py's _channel_stats with the emulated stage 1 and numpy's stage 2."""
    n, c = a.shape[0], a.shape[1]
    s = math.prod(a.shape[2:])
    launch = plans.stats_launch(n, c, s, sm_count)
    acc = host.accumulate_dtype(a.dtype)
    partial = np.full((2, launch.parts, c * launch.width), np.nan, dtype=acc)
    a = np.ascontiguousarray(a)
    b_arr = a if b is None else np.ascontiguousarray(b)
    width = c if launch.layout == "rows" else c * s
    lib.emulate_channel_sums(
        int(launch.layout == "rows"), TYPES[a.dtype.name], int(b is not None),
        ctypes.c_uint(launch.grid[0]), ctypes.c_uint(launch.grid[1]),
        _ptr(a), _ptr(b_arr), ctypes.c_longlong(n), ctypes.c_longlong(width),
        ctypes.c_longlong(s), ctypes.c_longlong(launch.step), _ptr(partial),
    )  # fmt: skip
    assert not np.isnan(partial).any(), "a partial sum was never written"
    result = partial.reshape(2, launch.parts, c, launch.width).sum(axis=(1, 3))
    return result[0], result[1]


STATS_CASES = [
    ((3, 2, 20, 20), 1),  # rows, one part per channel
    ((20, 2, 300), 8),  # rows, 3 parts whose ends fall inside rows
    ((4, 2, 64, 64), 8),  # rows, 8 parts of half a row each
    ((130, 3, 5), 2),  # cols, 3 row parts
    ((9, 5), 1),  # cols, s == 1
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("shape", "sm_count"), STATS_CASES)
def test_channel_stats_kernels_equal_twin(
    stats_lib: Any, dtype: Any, shape: tuple[int, ...], sm_count: int
) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) + 0.5).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype != np.float64 else {"rtol": 1e-12, "atol": 1e-12}
    got = _emulated_stats(stats_lib, x, None, sm_count)
    want = host.channel_sums(x)
    for gv, wv in zip(got, want, strict=True):
        np.testing.assert_allclose(gv, wv, **tol)
    got = _emulated_stats(stats_lib, g, x, sm_count)
    want = host.bn_backward_sums(g, x)
    for gv, wv in zip(got, want, strict=True):
        np.testing.assert_allclose(gv, wv, **tol)


def test_emulation_covers_multi_part_launches() -> None:
    """The emulated cases split both layouts into parts (read from their launch plans, so the
    check holds whichever worker or order runs the cases)."""
    launches = [
        plans.stats_launch(shape[0], shape[1], math.prod(shape[2:]), sm_count)
        for shape, sm_count in STATS_CASES
    ]
    split = {(launch.layout, launch.parts > 1) for launch in launches if launch.grid != (1, 1)}
    assert {("rows", True), ("cols", True)} <= split
