"""MultiNodeChainList: layer-wise split models train like the single-process model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

HERE = Path(__file__).resolve().parent


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_split_models_train_like_single_process(n: int) -> None:
    # A backward that waits on the wrong peer is a deadlock: the watchdog turns it into an error.
    env = {"MNIFY_WATCHDOG_TIMEOUT": "90"}
    run = run_ranks(n, HERE / "ranks_chain_list.py", env=env, timeout=240)
    for r in range(n):
        lines = run.rank_lines(r)
        not_passed = missing(lines, ("chain_list_line", "chain_list_fan", "one_output_piece"))
        assert not not_passed, f"rank {r} did not pass {not_passed}\n{run.describe()}"
