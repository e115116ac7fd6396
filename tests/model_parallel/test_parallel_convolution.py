"""ParallelConvolution2D on 2 and 3 real ranks equals a plain Convolution2D (1e-5 relative)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

HERE = Path(__file__).resolve().parent

CHECKS = [
    "out4",
    "out5",
    "out2",
    "out7_rect_dilated",
    "seeded_init",
    "two_layers",
    "data_input",
    "lazy_in_channels",
    "whole_layer_helpers",
    "per_rank_snapshot",
    "float16",
    "diverged_input",
]


@pytest.mark.mpi
@pytest.mark.parametrize(("n", "debug"), [(2, "0"), (3, "1")])
def test_parallel_convolution_matches_convolution2d(n: int, debug: str) -> None:
    # MNIFY_DEBUG=1 (3 ranks) also checks every layer's input is the same on every rank.
    env = {"MNIFY_WATCHDOG_TIMEOUT": "90", "MNIFY_DEBUG": debug}  # a deadlock fails fast
    run = run_ranks(n, HERE / "ranks_parallel_convolution.py", env=env, timeout=240)
    expected = CHECKS + (["debug_diverged_input"] if debug == "1" else [])
    for r in range(n):
        lines = run.rank_lines(r)
        not_passed = missing(lines, expected)
        assert not not_passed, f"rank {r} did not pass {not_passed}\n{run.describe()}"


def test_channel_counts_cover_every_channel_once() -> None:
    from mnify.runtime.links.parallel_convolution import channel_counts, channel_offsets

    assert channel_counts(5, 3) == [2, 2, 1]
    assert channel_counts(4, 2) == [2, 2]
    assert channel_counts(2, 3) == [1, 1, 0]
    assert channel_offsets([2, 2, 1]) == [0, 2, 4]
    for channels in range(1, 12):
        for size in range(1, 6):
            counts = channel_counts(channels, size)
            assert sum(counts) == channels and max(counts) - min(counts) <= 1


def test_no_attribute_collision_with_convolution2d() -> None:
    """The seed's bug: a subclass whose in/out_channels overwrote Convolution2D's."""
    import chainer

    from mnify.runtime.links import ParallelConvolution2D

    class OneRank:
        rank, size = 0, 1

    layer = ParallelConvolution2D(OneRank(), 3, 8, 3)  # type: ignore[arg-type]
    assert not isinstance(layer, chainer.links.Convolution2D)
    assert (layer.in_channels, layer.out_channels, layer.local_out_channels) == (3, 8, 8)
    assert layer.W.shape == (8, 3, 3, 3)
