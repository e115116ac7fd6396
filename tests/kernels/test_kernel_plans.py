"""The launch geometry of the CUDA kernels, replayed on the CPU.

No GPU is needed: each test rebuilds what every CUDA block of a kernel would do from the
tables and launch shapes in :mod:`mnify.runtime.kernels.plans` (the same index formulas as the
``.cu`` sources, written out with numpy) and checks that every element is covered exactly once
and lands in the right place. A wrong tile table, channel table or partition shows up here
before it reaches a GPU.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from mnify.runtime.kernels import host, plans


def _replay_bucket_copy(arrays: list[np.ndarray], buf: np.ndarray, to_buffer: bool) -> np.ndarray:
    """pack.cu's mnify_bucket_copy, block by block; returns how often each bucket slot was hit."""
    sizes = [a.size for a in arrays]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if sizes else []
    tile_array, tile_begin = plans.bucket_tiles(sizes)
    hits = np.zeros(buf.size, dtype=np.int64)
    for t in range(tile_array.size):  # blockIdx.x
        a = int(tile_array[t])
        begin = int(tile_begin[t])
        end = min(begin + plans.BUCKET_TILE, sizes[a])
        flat = arrays[a].reshape(-1)
        for lane in range(plans.BUCKET_THREADS):  # threadIdx.x, striding by blockDim.x
            idx = np.arange(begin + lane, end, plans.BUCKET_THREADS)
            slots = offsets[a] + idx
            if to_buffer:
                buf[slots] = flat[idx]
            else:
                flat[idx] = buf[slots]
            np.add.at(hits, slots, 1)
    return hits


@pytest.mark.parametrize(
    "sizes",
    [[5000, 1, 0, 2048, 2049, 7], [0], [], [1], [plans.BUCKET_TILE * 3], [64, 0, 0, 9, 4097]],
)
def test_bucket_tiles_cover_every_element_once(sizes: list[int]) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n) for n in sizes]
    total = sum(sizes)
    buf = np.full(total, np.nan)
    hits = _replay_bucket_copy(arrays, buf, to_buffer=True)
    assert (hits == 1).all()
    expected = np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)
    np.testing.assert_array_equal(buf, expected)

    back = [np.zeros_like(a) for a in arrays]
    _replay_bucket_copy(back, buf, to_buffer=False)
    for a, b in zip(arrays, back, strict=True):
        np.testing.assert_array_equal(a, b)


def _bench_gpu() -> ModuleType:
    """bench/gpu.py (not a package) loaded by path; importing it needs no CuPy."""
    path = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"
    spec = importlib.util.spec_from_file_location("mnify_bench_gpu", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bucket_tiles_for_resnet50_gradients() -> None:
    # the bucket of ResNet-50 (161 arrays): tiles never straddle arrays and add up to the sizes
    sizes = [math.prod(s) for s in _bench_gpu().resnet50_param_shapes()]
    assert len(sizes) == 161 and sum(sizes) == 25_557_032
    tile_array, tile_begin = plans.bucket_tiles(sizes)
    covered = np.minimum(tile_begin + plans.BUCKET_TILE, np.asarray(sizes)[tile_array]) - tile_begin
    assert (covered > 0).all()
    assert np.bincount(tile_array, weights=covered, minlength=len(sizes)).tolist() == sizes


def _replay_channel_blocks(
    src: np.ndarray, counts: list[int], n: int, s: int, gather: bool
) -> tuple[np.ndarray, np.ndarray]:
    """channels.cu's mnify_channel_blocks over all i (grid-stride order does not matter)."""
    channels = sum(counts)
    total = n * channels * s
    base, stride = plans.channel_block_tables(counts, n, s)
    i = np.arange(total, dtype=np.int64)
    t = i // s
    sp = i - t * s
    nn = t // channels
    ch = t - nn * channels
    f = base[ch] + nn * stride[ch] + sp
    dst = np.full(total, np.nan)
    hits = np.zeros(total, dtype=np.int64)
    if gather:
        dst[i] = src[f]
        np.add.at(hits, i, 1)
    else:
        dst[f] = src[i]
        np.add.at(hits, f, 1)
    return dst, hits


@pytest.mark.parametrize(
    ("counts", "n", "spatial"),
    [
        ([2, 2, 1], 3, (3, 5)),
        ([1, 3], 2, (4, 4)),
        ([4], 1, (1,)),
        ([1, 0, 2], 5, (3,)),
        ([3, 3], 2, ()),
    ],
)
def test_channel_tables_match_the_numpy_twin(
    counts: list[int], n: int, spatial: tuple[int, ...]
) -> None:
    s = math.prod(spatial)
    rng = np.random.default_rng(1)
    full = rng.standard_normal((n, sum(counts), *spatial))
    flat = np.empty(full.size)
    host.split_channels(full, counts, flat)

    gathered, hits = _replay_channel_blocks(flat, counts, n, s, gather=True)
    assert (hits == 1).all()
    np.testing.assert_array_equal(gathered.reshape(full.shape), full)

    split, hits = _replay_channel_blocks(full.reshape(-1), counts, n, s, gather=False)
    assert (hits == 1).all()
    np.testing.assert_array_equal(split, flat)


def _replay_channel_sums(x: np.ndarray, sm_count: int) -> tuple[np.ndarray, np.ndarray, str]:
    """channel_stats.cu's stage 1 (rows or cols) per block, then device.py's stage 2 sum."""
    n, c = x.shape[0], x.shape[1]
    s = math.prod(x.shape[2:])
    x3 = x.reshape(n, c, s).astype(np.float64)
    launch = plans.stats_launch(n, c, s, sm_count)
    assert launch.grid[1] <= plans.MAX_GRID_Y
    partial = np.full((2, launch.parts, c * launch.width), np.nan)
    hits = np.zeros((n, c, s), dtype=np.int64)
    if launch.layout == "rows":
        assert launch.grid == (c, launch.parts) and launch.width == 1
        total = n * s
        for ch in range(c):
            for part in range(launch.parts):
                lo = part * launch.step
                hi = min(lo + launch.step, total)
                m = np.arange(lo, hi)
                rows, cols = m // s, m % s
                vals = x3[rows, ch, cols]
                np.add.at(hits, (rows, ch, cols), 1)
                partial[0, part, ch] = vals.sum()
                partial[1, part, ch] = (vals * vals).sum()
    else:
        k = c * s
        assert launch.grid[0] * 32 >= k and launch.width == s
        xk = x3.reshape(n, k)
        for part in range(launch.parts):
            lo = part * launch.step
            hi = min(lo + launch.step, n)
            vals = xk[lo:hi]
            partial[0, part] = vals.sum(axis=0)
            partial[1, part] = (vals * vals).sum(axis=0)
            hits.reshape(n, k)[lo:hi] += 1
    assert (hits == 1).all(), "every element must be read exactly once"
    result = partial.reshape(2, launch.parts, c, launch.width).sum(axis=(1, 3))
    return result[0], result[1], launch.layout


@pytest.mark.parametrize(
    ("shape", "layout"),
    [
        ((4, 3, 20, 20), "rows"),  # s = 400
        ((1, 2, 300), "rows"),  # one sample, long rows
        ((3, 64, 16, 16), "rows"),  # many channels: one part each
        ((5, 2, 33, 31), "rows"),  # odd sizes: parts end inside rows
        ((130, 7, 3), "cols"),  # small s, many rows: several row parts
        ((9, 5), "cols"),  # after a linear layer, s == 1
        ((1000, 3, 1), "cols"),
        ((2, 4, 7, 7), "cols"),
    ],
)
@pytest.mark.parametrize("sm_count", [1, 132])
def test_stats_launch_reads_every_element_once(
    shape: tuple[int, ...], layout: str, sm_count: int
) -> None:
    x = np.random.default_rng(2).standard_normal(shape)
    total, sumsq, used = _replay_channel_sums(x, sm_count)
    assert used == layout
    ref_sum, ref_sq = host.channel_sums(x)
    np.testing.assert_allclose(total, ref_sum, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sumsq, ref_sq, rtol=1e-12, atol=1e-12)


def test_stats_launch_fills_a_big_gpu_for_few_channels() -> None:
    # ResNet's first BN: (32, 64, 112, 112) must be split well beyond 64 blocks on 132 SMs
    launch = plans.stats_launch(32, 64, 112 * 112, 132)
    assert launch.layout == "rows"
    assert launch.grid[0] * launch.grid[1] >= 4 * 132
