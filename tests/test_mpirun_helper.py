"""The rank launcher itself: output per rank, failures carry every rank's output."""

from __future__ import annotations

import pytest

from tests.support.mpirun import run_ranks


def test_each_rank_runs_and_is_tagged() -> None:
    run = run_ranks(3, "from mpi4py import MPI\nprint('hello', MPI.COMM_WORLD.rank)\n")
    for r in range(3):
        assert run.rank_lines(r) == [f"hello {r}"]


def test_failure_shows_all_output() -> None:
    src = "from mpi4py import MPI\nimport sys\nprint('rank', MPI.COMM_WORLD.rank)\nsys.exit(3)\n"
    with pytest.raises(AssertionError) as info:
        run_ranks(2, src, timeout=60)
    assert "rank 0" in str(info.value) and "rank 1" in str(info.value)


def test_timeout_is_reported() -> None:
    run = run_ranks(2, "import time\ntime.sleep(30)\n", timeout=3, check=False)
    assert run.timed_out
