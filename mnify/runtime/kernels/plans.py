"""Launch geometry and index tables for the CUDA kernels, computed with numpy only.

Split from :mod:`mnify.runtime.kernels.device` so the arithmetic that decides which block
touches which element can be tested on machines without a GPU (tests/kernels replays each
kernel's index formulas over these tables with numpy). The device module uploads the tables
and launches; nothing here imports CuPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# pack/unpack: elements one block copies; a block of 256 threads does 8 each (MN_ITEMS in
# pack.cu: a tile of exactly MN_ITEMS * threads takes the kernel's unrolled path)
BUCKET_THREADS = 256
BUCKET_TILE = 8 * BUCKET_THREADS
# channel statistics: from this spatial size on, the "rows" layout is used (else "cols")
ROWS_MIN_SPATIAL = 256
STATS_THREADS = 256
# the "cols" layout's block: 32 neighbouring columns x 8 row lanes
COLS_BLOCK = (32, 8)
# each stats block should get at least this many elements before the work is split further
MIN_ELEMS_PER_BLOCK = 2048
MAX_GRID_Y = 65535


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def bucket_tiles(sizes: Sequence[int], tile: int = BUCKET_TILE) -> tuple[np.ndarray, np.ndarray]:
    """(tile_array int32, tile_begin int64): tile t covers ``[begin, begin + tile)`` of one array.

    Empty arrays get no tile; every element of every array is in exactly one tile.
    """
    size_arr = np.asarray(sizes, dtype=np.int64).reshape(-1)
    tiles = (size_arr + tile - 1) // tile
    n_tiles = int(tiles.sum())
    first = np.cumsum(tiles) - tiles
    tile_array = np.repeat(np.arange(len(size_arr), dtype=np.int32), tiles)
    tile_begin = (np.arange(n_tiles, dtype=np.int64) - np.repeat(first, tiles)) * tile
    return tile_array, tile_begin


def channel_block_tables(counts: Sequence[int], n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(chan_base, chan_stride) int64 per full-tensor channel, as channels.cu documents.

    Element (i, ch, j) of the full (n, sum(counts), s) tensor lives in the rank-major buffer at
    ``chan_base[ch] + i * chan_stride[ch] + j``.
    """
    base: list[int] = []
    stride: list[int] = []
    block = 0
    for c in counts:
        base.extend(block + j * s for j in range(c))
        stride.extend([c * s] * c)
        block += n * c * s
    return np.asarray(base, dtype=np.int64), np.asarray(stride, dtype=np.int64)


@dataclass(frozen=True)
class StatsLaunch:
    """How the per-channel statistics kernel is launched for x shaped (n, c, s).

    ``rows``: grid (c, parts), block (256,), part p covers elements
    ``[p * step, (p + 1) * step)`` of the channel's n*s; partial is (2, parts, c).
    ``cols``: grid (ceil(c*s / 32), parts), block (32, 8), part p covers rows
    ``[p * step, (p + 1) * step)``; partial is (2, parts, c*s) and stage 2 also sums over s.
    """

    layout: str
    grid: tuple[int, int]
    block: tuple[int, ...]
    parts: int
    step: int
    width: int  # columns per channel in the partial array (1 for rows, s for cols)


def stats_launch(n: int, c: int, s: int, sm_count: int) -> StatsLaunch:
    """Fill about four blocks per multiprocessor, never splitting below a useful block size."""
    target_blocks = 4 * max(1, sm_count)
    if s >= ROWS_MIN_SPATIAL:
        total = n * s
        parts = max(1, min(ceil_div(target_blocks, c), ceil_div(total, MIN_ELEMS_PER_BLOCK)))
        parts = min(parts, MAX_GRID_Y)
        step = ceil_div(total, parts)
        parts = ceil_div(total, step)
        return StatsLaunch("rows", (c, parts), (STATS_THREADS,), parts, step, 1)
    k = c * s
    blocks_x = ceil_div(k, COLS_BLOCK[0])
    rows_min = MIN_ELEMS_PER_BLOCK // (COLS_BLOCK[0] * COLS_BLOCK[1]) * COLS_BLOCK[1]
    parts = max(1, min(ceil_div(target_blocks, blocks_x), ceil_div(n, rows_min)))
    parts = min(parts, MAX_GRID_Y)
    step = ceil_div(n, parts)
    parts = ceil_div(n, step)
    return StatsLaunch("cols", (blocks_x, parts), COLS_BLOCK, parts, step, s)
