"""Leaving MPI: ranks that end normally meet in the exit barrier before ``MPI_Finalize`` (bounded),
and a singleton leaves no Open MPI file behind.

Whether a rank waited is read from what happens after the barrier: an exit hook registered
*before* the communicator (so it runs after the barrier, hooks run last-registered first) looks
for the file the slow rank writes as its last act.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mpirun import REPO, mpi_env, run_ranks

pytestmark = pytest.mark.mpi

BARRIER_SCRIPT = """
import atexit, os, sys, time
from pathlib import Path

marker = Path(sys.argv[1])
work = float(sys.argv[2])


def after_the_barrier():
    print(f"AFTER {rank} peer_done={marker.exists()}", flush=True)


atexit.register(after_the_barrier)  # before the communicator: runs after its exit barrier
from mnify.runtime.communicators import create_communicator

comm = create_communicator("naive")
rank = comm.rank
comm.barrier()
if rank == 0:
    time.sleep(work)  # a post-training tail on rank 0 alone
    marker.write_text("done")
"""


def _after(run_lines: list[str], rank: int) -> str:
    [line] = [line for line in run_lines if line.startswith(f"AFTER {rank} ")]
    return line


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_that_finish_wait_for_the_slow_one_before_finalizing(n: int, tmp_path: Path) -> None:
    marker = tmp_path / "rank0-done"
    run = run_ranks(n, BARRIER_SCRIPT, [str(marker), "3"], cwd=tmp_path, timeout=120)
    for r in range(1, n):
        assert _after(run.rank_lines(r), r) == f"AFTER {r} peer_done=True", run.describe()


def test_the_exit_barrier_is_bounded(tmp_path: Path) -> None:
    """A peer that takes longer than MNIFY_EXIT_BARRIER does not hold the others."""
    marker = tmp_path / "rank0-done"
    run = run_ranks(
        2, BARRIER_SCRIPT, [str(marker), "20"], cwd=tmp_path, env={"MNIFY_EXIT_BARRIER": "1"}
    )
    assert _after(run.rank_lines(1), 1) == "AFTER 1 peer_done=False", run.describe()
    assert _after(run.rank_lines(0), 0) == "AFTER 0 peer_done=True", run.describe()


SINGLETON_SCRIPT = """
import re
from mnify.runtime.communicators import create_communicator

comm = create_communicator("naive")
comm.allreduce_obj(1)
maps = open("/proc/self/maps").read()
for path in sorted(set(re.findall(r"(/dev/shm/\\S+)", maps))):
    print("MAPPED", path)
"""


def test_a_singleton_leaves_no_segment_and_no_session_directory(tmp_path: Path) -> None:
    script = tmp_path / "singleton.py"
    script.write_text(SINGLETON_SCRIPT, encoding="utf-8")
    env = mpi_env()
    for name in ("PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMI_SIZE"):
        env.pop(name, None)
    env["TMPDIR"] = str(tmp_path)  # Open MPI puts the singleton's session directory here
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    mapped = [
        line.split(" ", 1)[1] for line in run.stdout.splitlines() if line.startswith("MAPPED")
    ]
    assert [p for p in mapped if "sm_segment" in p], run.stdout  # Open MPI made one
    assert [p for p in mapped if Path(p).exists()] == []
    sessions = [p for p in tmp_path.glob("ompi.*/*/*") if p.is_dir()]
    assert sessions == [], sessions
