"""Multi-node and synchronized iterators on 2 and 3 real ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

HERE = Path(__file__).resolve().parent

CHECKS = [
    "multi_node_same_batches",
    "multi_node_stop_and_reset",
    "multi_node_serialize",
    "synchronized_order",
    "synchronized_multithread",
    "synchronized_plain_and_serialize",
]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_iterators_agree_across_ranks(n: int) -> None:
    env = {"MNIFY_WATCHDOG_TIMEOUT": "90"}  # a deadlock fails fast
    run = run_ranks(n, HERE / "ranks_iterators.py", env=env, timeout=240)
    for r in range(n):
        lines = run.rank_lines(r)
        not_passed = missing(lines, CHECKS)
        assert not not_passed, f"rank {r} did not pass {not_passed}\n{run.describe()}"
