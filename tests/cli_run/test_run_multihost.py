"""``mnify run --hostfile`` across hosts of the namespace test bed, the way a cluster runs it.

The bed's launch agent and network flags go through ``--mpi-arg``, exactly as a user passes
``--mca``/``--prtemca`` settings on a real cluster.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.testbed import TestBed, build, namespaces_refused

SCRIPT = Path(__file__).parent / "scripts" / "scenarios.py"
MNIFY = Path(sys.executable).parent / "mnify"
pytestmark = [pytest.mark.multihost, pytest.mark.mpi]


@pytest.fixture(scope="module")
def bed() -> Iterator[TestBed]:
    refused = namespaces_refused()
    if refused is not None:
        pytest.skip(refused)
    bed = build(2)
    try:
        yield bed
    finally:
        bed.teardown()


def _mnify_run(bed: TestBed, slots: list[int], *script_args: str) -> tuple[int, str, str]:
    command = [
        str(MNIFY), "run", "-n", str(sum(slots)),
        "--hostfile", str(bed.hostfile(slots)),
        "--mpi-arg", shlex.join(bed.mpiexec_args()),
        str(SCRIPT), *script_args,
    ]  # fmt: skip
    job = bed.start(slots, [], command=command, env={"MNIFY_ABORT_GRACE": "1"})
    run = job.wait(timeout=120)
    assert not run.timed_out, run.describe()
    return run.returncode, run.stdout, run.stderr


def test_ranks_land_on_the_hostfile_hosts(bed: TestBed) -> None:
    code, out, err = _mnify_run(bed, [2, 1], "hosts")
    assert code == 0, out + err
    first, second = bed.hosts[0].name, bed.hosts[1].name
    lines = out.splitlines()
    assert f"rank 0 of 3 on {first}" in lines and f"rank 1 of 3 on {first}" in lines, out
    assert f"rank 2 of 3 on {second}" in lines, out


def test_failure_on_the_second_host_names_rank_and_host(bed: TestBed) -> None:
    code, out, err = _mnify_run(bed, [2, 1], "hosts", "fail")
    assert code != 0, out + err
    second = bed.hosts[1].name
    assert f"error on rank 2 (of 3) on host {second}" in err, err
    assert "RuntimeError: no GPU 0 on this node" in err
    assert err.count("Traceback (most recent call last)") == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signal_stops_the_ranks_on_every_host(bed: TestBed, sig: signal.Signals) -> None:
    command = [
        str(MNIFY), "run", "-n", "3",
        "--hostfile", str(bed.hostfile([2, 1])),
        "--mpi-arg", shlex.join(bed.mpiexec_args()),
        str(SCRIPT), "wait",
    ]  # fmt: skip
    job = bed.start([2, 1], [], command=command)
    for r in range(3):
        job.wait_for(f"ready {r}", timeout=60)
    deadline = time.monotonic() + 10  # for mnify run and every process on every host
    job.proc.send_signal(sig)  # the agent execs mnify run: this is mnify run's pid
    run = job.wait(timeout=10)
    assert not run.timed_out, run.describe()
    assert run.returncode == 128 + sig, run.describe()
    while any(bed.pids(h.name) for h in bed.hosts) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {h.name: bed.pids(h.name) for h in bed.hosts} == {h.name: [] for h in bed.hosts}
