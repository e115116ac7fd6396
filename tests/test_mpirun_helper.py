"""The rank launcher itself: output per rank, failures carry every rank's output."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mnify.launch.mpiexec import find_mpiexec
from tests.support.mpirun import run_ranks


def test_each_rank_runs_and_is_tagged() -> None:
    run = run_ranks(3, "from mpi4py import MPI\nprint('hello', MPI.COMM_WORLD.rank)\n")
    for r in range(3):
        assert run.rank_lines(r) == [f"hello {r}"]


def test_it_launches_mnify_runs_mpiexec_oversubscribed_as_root_may() -> None:
    """The same mpiexec ``mnify run`` finds, always ``--oversubscribe`` (also within the cores),
    and root allowed (``OMPI_ALLOW_RUN_AS_ROOT*`` reach the ranks)."""
    src = "import os\nprint('ROOT', os.environ.get('OMPI_ALLOW_RUN_AS_ROOT_CONFIRM'))\n"
    run = run_ranks(1, src)
    assert run.cmd[0] == find_mpiexec().path
    assert run.cmd.count("--oversubscribe") == 1
    assert run.rank_lines(0) == ["ROOT 1"]


def test_failure_shows_all_output() -> None:
    src = "from mpi4py import MPI\nimport sys\nprint('rank', MPI.COMM_WORLD.rank)\nsys.exit(3)\n"
    with pytest.raises(AssertionError) as info:
        run_ranks(2, src, timeout=60)
    assert "rank 0" in str(info.value) and "rank 1" in str(info.value)


def test_timeout_is_reported() -> None:
    run = run_ranks(2, "import time\ntime.sleep(30)\n", timeout=3, check=False)
    assert run.timed_out


def test_a_timeout_kills_every_rank_not_just_mpiexec() -> None:
    """Open MPI puts each rank in a process group of its own: killing mpiexec's group alone
    left them running."""
    src = "import os, time\nprint('PID', os.getpid(), flush=True)\ntime.sleep(60)\n"
    run = run_ranks(3, src, timeout=8, check=False)
    assert run.timed_out
    pids = [int(line.rsplit(" ", 1)[1]) for line in run.output.splitlines() if " PID " in line]
    assert len(pids) == 3, run.describe()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
