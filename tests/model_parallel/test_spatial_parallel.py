"""create_spatial_parallel_model on 2, 3 and 4 real ranks equals one process (float64).

The rank script (ranks_spatial_parallel.py) groups every check into one launch per rank count:
uneven and empty slabs, stride 2 with boundaries off the stride, dilation, padding, max and
average pooling across slab boundaries, batch normalization over the whole image, global
average pooling with a Linear head, a map output, the input gradient, training through a plain
optimizer, the halo's size, refusals of what cannot be split, and (4 ranks) a 2 spatial x 2
data layout against one process at the combined batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

HERE = Path(__file__).resolve().parent

CHECKS = [
    "windows",
    "windows_no_overlap",
    "windows_axis_w",
    "strided",
    "strided_thin",
    "sequential",
    "sequential_lambda",
    "branches",
    "branches_thin",
    "segmenter_input_grad",
    "segmenter_tall",
    "training_classifier",
    "refusals",
    "halo_rows",
]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_spatial_model_matches_one_process(n: int) -> None:
    env = {"MNIFY_WATCHDOG_TIMEOUT": "120"}  # a deadlocked exchange fails, naming the rank
    run = run_ranks(n, HERE / "ranks_spatial_parallel.py", env=env, timeout=600)
    expected = CHECKS + (["hybrid_2x2"] if n == 4 else [])
    for r in range(n):
        not_passed = missing(run.rank_lines(r), expected)
        assert not not_passed, f"rank {r} did not pass {not_passed}\n{run.describe()}"


@pytest.mark.parametrize("rows", range(1, 12))
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("ksize", "stride", "pad", "dilate"), [(3, 1, 1, 1), (5, 2, 2, 1), (3, 1, 2, 2), (2, 2, 0, 1)]
)
def test_halo_plan_gives_every_rank_the_rows_its_windows_read(
    rows: int, size: int, ksize: int, stride: int, pad: int, dilate: int
) -> None:
    """Sends and receives pair up, and own + received rows are exactly the needed rows."""
    from mnify.runtime.functions.halo_exchange import (
        HaloPlan,
        SlabLayout,
        rows_needed,
        window_output_size,
    )

    layout = SlabLayout.even(2, rows, size)
    out = window_output_size(rows, ksize, stride, pad, dilate)
    if out < 1:
        return
    out_layout = SlabLayout.even(2, out, size)
    need = tuple(rows_needed(a, b, ksize, stride, pad, dilate) for a, b in out_layout.bounds)
    plans = [HaloPlan(layout, need, r) for r in range(size)]
    for r, plan in enumerate(plans):
        for q, span in plan.sends():
            assert (r, span) in plans[q].recvs()
        covered = sorted([plan.own(), *(span for _, span in plan.recvs())])
        got = [i for a, b in covered for i in range(a, b)]
        assert got == list(range(*plan.clipped(r)))


def test_halo_pack_unpack_numpy_twin() -> None:
    from mnify.runtime import kernels

    x = np.arange(2 * 3 * 7 * 4, dtype=np.float64).reshape(2, 3, 7, 4)
    block = kernels.halo_pack(x, 2, 2, 5)
    assert block.flags.c_contiguous and np.array_equal(block, x[:, :, 2:5])
    cols = kernels.halo_pack(x, 3, 1, 3)
    assert np.array_equal(cols, x[..., 1:3])
    out = kernels.halo_unpack([(1, block), (4, x[:, :, :1])], (2, 3, 6, 4), 2, -1.0, np)
    want = np.full((2, 3, 6, 4), -1.0)
    want[:, :, 1:4] = x[:, :, 2:5]
    want[:, :, 4:5] = x[:, :, :1]
    assert np.array_equal(out, want)
    with pytest.raises(ValueError):
        kernels.halo_pack(x, 2, 5, 9)
