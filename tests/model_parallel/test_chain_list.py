"""MultiNodeChainList: a layer-wise split MLP trains like the single-process MLP."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mpirun import run_ranks

HERE = Path(__file__).resolve().parent


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("n", "check"), [(2, "chain_list_two_ranks_round_trip"), (3, "chain_list_pipeline")]
)
def test_split_mlp_trains_like_single_process(n: int, check: str) -> None:
    run = run_ranks(n, HERE / "ranks_chain_list.py", timeout=180)
    for r in range(n):
        lines = run.rank_lines(r)
        assert f"CHECK {check} ok" in lines, run.describe()
        assert "CHECK one_output_piece ok" in lines, run.describe()
        assert "DONE" in lines, run.describe()
