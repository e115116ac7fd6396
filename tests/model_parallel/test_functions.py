"""Differentiable collectives and send/recv on 2 and 3 real ranks, against one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

HERE = Path(__file__).resolve().parent

CHECKS = [
    "allgather_float32",
    "allgather_float16",
    "allgather_unused_outputs",
    "alltoall",
    "bcast",
    "gather",
    "scatter",
    "allreduce_sum",
    "allreduce_mean",
    "send_recv_pipeline",
    "delegate_round_trip",
    "pseudo_connect",
]


@pytest.mark.mpi
@pytest.mark.parametrize(("n", "debug"), [(2, "0"), (3, "1")])
def test_functions_match_single_process(n: int, debug: str) -> None:
    # The 3-rank run also has MNIFY_DEBUG on: per-rank shapes that legitimately differ must pass.
    env = {"MNIFY_DEBUG": debug, "MNIFY_WATCHDOG_TIMEOUT": "90"}  # a deadlock fails fast
    run = run_ranks(n, HERE / "ranks_functions.py", env=env, timeout=240)
    for r in range(n):
        lines = run.rank_lines(r)
        not_passed = missing(lines, CHECKS)
        assert not not_passed, f"rank {r} did not pass {not_passed}\n{run.describe()}"
