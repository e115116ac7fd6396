"""The communicator contract on real ranks: every collective against numpy references.

Each launch runs several communicators through ``comm_scripts/collectives.py`` so the suite pays
for few ``mpiexec`` start-ups. Sizes 2 and 3 (odd sizes find off-by-one splits); faked host names
give the hierarchical communicator several hosts on one machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mpirun import RankRun, run_ranks
from tests.support.rank_checks import missing

SCRIPTS = Path(__file__).parent / "comm_scripts"
pytestmark = pytest.mark.mpi


def _assert_done(run: RankRun, n: int, tags: list[str]) -> None:
    for r in range(n):
        not_passed = missing(run.rank_lines(r), tags)
        assert not not_passed, f"rank {r} did not finish {not_passed}\n{run.describe()}"


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective_matches_numpy(n: int) -> None:
    names = ["naive", "flat", "hierarchical", "auto", "flat/small", "flat/mpi", "flat/mpi+small"]
    run = run_ranks(n, SCRIPTS / "collectives.py", names, timeout=180)
    _assert_done(run, n, names)
    for r in range(n):
        lines = run.rank_lines(r)
        # one host, CPU only: auto is flat
        assert "CLASS auto flat" in lines
        # flat averages through shared memory on one host unless told not to; others never do
        shm = n > 1
        assert f"SHM flat {shm}" in lines and f"SHM flat/small {shm}" in lines
        assert "SHM flat/mpi False" in lines and "SHM flat/mpi+small False" in lines
        assert "SHM naive False" in lines and "SHM hierarchical True" in lines


@pytest.mark.parametrize(
    ("hosts", "debug_and_watchdog"),
    [("0,0,1,1", False), ("0,1,1", True)],
    ids=["hosts-2-2-tiny-buckets", "hosts-1-2-debug-watchdog"],
)
def test_fake_hosts_hierarchical_and_flat(hosts: str, debug_and_watchdog: bool) -> None:
    """Hierarchical over faked hosts, with 64-byte buckets so every array spans several
    buckets; the second case also runs every collective under MNIFY_DEBUG and the watchdog."""
    n = len(hosts.split(","))
    env = {"MNIFY_TEST_HOSTS": hosts}
    if debug_and_watchdog:
        env |= {"MNIFY_DEBUG": "1", "MNIFY_WATCHDOG_TIMEOUT": "60"}
    names = ["hierarchical/small", "hierarchical/mpi+small"]
    # unequal hosts with a tight shared-memory budget: slots smaller than buckets, yet every
    # host must cut the same buckets
    names += (
        ["naive/small", "flat/small", "hierarchical/tinyshm"]
        if debug_and_watchdog
        else ["auto/small"]
    )
    run = run_ranks(n, SCRIPTS / "collectives.py", names, env=env, timeout=180)
    _assert_done(run, n, names)
    for r in range(n):
        lines = run.rank_lines(r)
        # hierarchical takes the intra-host stages through shared memory unless told not to
        assert "SHM hierarchical/small True" in lines, run.output
        assert "SHM hierarchical/mpi+small False" in lines, run.output
        if debug_and_watchdog:
            assert "SHM hierarchical/tinyshm True" in lines, run.output
        if not debug_and_watchdog:
            # auto picks hierarchical when hosts hold several ranks
            assert "CLASS auto/small hierarchical" in lines


def test_device_arrays_are_staged_through_the_host_and_come_back_as_device_arrays() -> None:
    """CuPy arrays, with a host-memory stand-in for CuPy (no GPU here): results come back in
    the caller's array module and in-place operations reach the device arrays."""
    names = ["naive", "flat", "hierarchical"]
    run = run_ranks(3, SCRIPTS / "staging.py", names, timeout=120)
    _assert_done(run, 3, names)
