"""Network and process faults across hosts, with the collective watchdog on.

- a host whose cable is pulled mid-training: the job ends within watchdog + 10 s and the message
  names that host's ranks;
- a rank SIGKILLed on one host: the job ends and the rank and host are named;
- a slow but alive link (tbf): collectives take longer but finish inside the timeout, no alarm;
- ``mnify run --hostfile`` on the test bed: one error raised on every host reads as one error.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from testkit.testbed import RankJob, TestBed

TRAIN = Path(__file__).resolve().parent / "scripts" / "train_loop.py"
MNIFY_RUN = [str(Path(sys.executable).parent / "mnify"), "run", "-n", "4"]
ABORT_DELAY = ["--mca", "opal_abort_delay", "1"]
LOST_DAEMON = "PRTE has lost communication with a remote daemon"


def train(
    bed: TestBed, steps: int, floats: int, pause: float, watchdog: float, **kw: object
) -> RankJob:
    """2 hosts x 2 ranks averaging gradients every step (hierarchical across the hosts)."""
    env = {"MNIFY_WATCHDOG_TIMEOUT": str(watchdog)}
    argv = [sys.executable, str(TRAIN), str(steps), str(floats), str(pause)]
    return bed.start([2, 2], argv, env=env, **kw)  # type: ignore[arg-type]


def rank_pid(bed: TestBed, host: str, rank: int) -> int:
    """The pid of MPI rank ``rank`` among the processes running on ``host``."""
    for pid in bed.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if TRAIN.name.encode() in cmdline and f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"rank {rank} not found on {host}")


def test_host_link_down_mid_training_names_its_ranks(
    make_testbed: Callable[[int], TestBed],
) -> None:
    bed = make_testbed(2)
    watchdog = 3.0
    job = train(bed, 100_000, 30_000, 0.05, watchdog)
    job.wait_for("[1,3]<stdout>: STEP 3", timeout=90)  # both hosts are training
    bed.link_down("mnb")
    run = job.wait(timeout=watchdog + 10)
    assert not run.timed_out, f"job still running {watchdog + 10:g} s after the link went down"
    # mnb's ranks 2 and 3 are the ones named, by the ranks still reachable (on mna). Under
    # two_dimensional (what auto picks here) both mna ranks wait across the cable, so either
    # one may time out and abort first.
    assert "rank(s) 2-3 never arrived" in run.output, run.describe()
    assert re.search(r"\[mnify\] rank [01] \(host mna\) failed:", run.output), run.describe()
    # Open MPI 5.0.11 exits 0 when it ends a job because it lost a daemon, even after a rank's
    # MPI_Abort(1); it does print why. Anything else must be a failure status.
    assert run.returncode != 0 or LOST_DAEMON in run.output, run.describe()


def test_rank_killed_on_one_host_is_named(make_testbed: Callable[[int], TestBed]) -> None:
    bed = make_testbed(2)
    watchdog = 10.0
    # A rank whose socket to the dead one closes aborts at once (MPI_ERRORS_ARE_FATAL), racing
    # the launcher's own report of the killed rank; one second of delay lets the report win.
    job = train(bed, 100_000, 30_000, 0.05, watchdog, mpiexec_args=ABORT_DELAY)
    job.wait_for("[1,3]<stdout>: STEP 3", timeout=90)
    os.kill(rank_pid(bed, "mnb", 3), signal.SIGKILL)
    run = job.wait(timeout=watchdog + 10)
    assert not run.timed_out
    assert run.returncode != 0, run.describe()
    text = " ".join(run.output.split())
    assert "rank 3" in text and "node mnb" in text and "signal 9" in text, run.describe()


def test_slow_link_without_false_alarm(make_testbed: Callable[[int], TestBed]) -> None:
    bed = make_testbed(2)
    rate_bytes_s, burst = 20e6 / 8, 512 * 1024
    bed.limit_rate("20mbit", burst=f"{burst // 1024}kb")
    steps, floats = 4, 500_000  # 2 MB of gradients a step
    sent_before = bed.bytes_sent("mnb")
    run = train(bed, steps, floats, 0.0, watchdog=10).wait(timeout=120)
    assert run.returncode == 0, run.describe()
    for r in range(4):
        assert run.rank_lines(r)[-1] == "DONE", run.describe()
    assert "timed out" not in run.output and "never arrived" not in run.output
    # The link really was slow: an all-reduce of B bytes between the two host leaders must
    # receive about B bytes over mnb's cable, which tbf lets through at 20 Mbit/s (plus a burst).
    step_seconds = [float(line.split()[2]) for line in run.rank_lines(2) if line.startswith("STEP")]
    assert len(step_seconds) == steps
    floor = steps * max(0.0, (floats * 4 - burst) / rate_bytes_s)
    assert sum(step_seconds) >= floor, (step_seconds, floor)
    assert bed.bytes_sent("mnb") - sent_before >= steps * floats * 4


FAIL_EVERYWHERE = """
from mnify import runtime as mn

comm = mn.create_communicator("auto")
def load_batch(step):
    raise ValueError(f"bad batch at step {step}")

comm.barrier()  # every rank, on both hosts, fails at the same point
load_batch(3)
"""


def test_mnify_run_collapses_one_error_across_hosts(bed3: TestBed) -> None:
    script = bed3.script_file(FAIL_EVERYWHERE)
    command = [
        *MNIFY_RUN,
        "--hostfile",
        str(bed3.hostfile([2, 2])),
        "--mpi-arg",
        " ".join(bed3.mpiexec_args()),
        # a loaded CI machine: give every failing rank time to print before the first abort
        "-x",
        "MNIFY_ABORT_GRACE=3",
        str(script),
    ]
    run = bed3.start([2, 2], [], command=command).wait(timeout=60)
    assert run.returncode != 0, run.describe()
    assert run.stderr.count("ValueError: bad batch at step 3") == 1, run.describe()
    header = [line for line in run.stderr.splitlines() if "error on ranks" in line]
    assert len(header) == 1 and "ranks 0-3 (all 4)" in header[0], run.describe()
    assert "mna" in header[0] and "mnb" in header[0], header


def test_mnify_run_reports_a_host_dropping_off(
    make_testbed: Callable[[int], TestBed],
) -> None:
    bed = make_testbed(2)
    command = [
        *(*MNIFY_RUN, "--watchdog", "3"),
        *("--hostfile", str(bed.hostfile([2, 2])), "--mpi-arg", " ".join(bed.mpiexec_args())),
        *(str(TRAIN), "100000", "30000", "0.05"),
    ]
    job = bed.start([2, 2], [], command=command)
    job.wait_for("STEP 3", timeout=90)
    bed.link_down("mnb")
    run = job.wait(timeout=3 + 15)
    assert not run.timed_out, run.describe()
    assert "rank(s) 2-3 never arrived" in run.stderr, run.describe()
    if run.returncode != 0:
        # The summary names the lost host's ranks once and calls it a communication failure.
        assert "timed out waiting for rank(s) 2-3" in run.stderr, run.describe()
        assert "a communication failure" in run.stderr
    else:
        # mnify run passes on mpiexec's status, and Open MPI 5.0.11 sometimes exits 0 after
        # losing a daemon (see the link-down test); then mnify run prints the ranks'
        # tracebacks without a summary. Only that case may exit 0.
        assert LOST_DAEMON in run.output, run.describe()
