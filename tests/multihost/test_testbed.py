"""The test bed itself: hosts are really separate, traffic really crosses their links, nothing leaks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from testkit.testbed import (
    AGENT,
    TestBed,
    _alive,
    _our_links,
    _our_netns,
    _owner_pid,
    cleanup_stale,
    testbed,
)

PLACEMENT = """
import json, os
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
# 4 MiB through an allreduce: with shared memory off, ranks on different hosts must use the links.
total = comm.allreduce(np.full(1 << 20, comm.rank + 1, dtype=np.float32), op=MPI.SUM)
print(json.dumps({
    "rank": comm.rank,
    "size": comm.size,
    "name": MPI.Get_processor_name(),
    "netns": os.stat("/proc/self/ns/net").st_ino,
    "sum": float(total[0]),
}))
"""


def _records(run_output: str) -> list[dict[str, object]]:
    found = []
    for line in run_output.splitlines():
        text = line.split(">:", 1)[-1].strip()
        if text.startswith("{"):
            found.append(json.loads(text))
    return sorted(found, key=lambda r: int(str(r["rank"])))


def test_ranks_land_on_their_hosts_and_talk_through_the_links(bed3: TestBed) -> None:
    before = {h.name: bed3.bytes_sent(h.name) for h in bed3.hosts}
    run = bed3.run([2, 1, 1], PLACEMENT, timeout=90)
    records = _records(run.stdout)
    assert [r["name"] for r in records] == ["mna", "mna", "mnb", "mnc"], run.describe()
    assert all(r["sum"] == 1 + 2 + 3 + 4 for r in records)
    # Each host is its own network namespace; ranks of one host share it.
    inodes = [r["netns"] for r in records]
    assert inodes[0] == inodes[1] and len(set(inodes)) == 3
    # The 4 MiB payload crossed every host's cable (counted on the bridge side of its veth).
    for host in ("mna", "mnb", "mnc"):
        sent = bed3.bytes_sent(host) - before[host]
        assert sent > 2 << 20, f"{host} sent only {sent} bytes: traffic bypassed the test bed links"


def test_hostnames_addresses_and_isolation(bed3: TestBed) -> None:
    for host in bed3.hosts:
        shown = bed3.on_host(host.name, ["sh", "-c", "hostname; ip -o -4 addr show dev eth0"])
        assert shown.returncode == 0, shown.stderr
        name, addr_line = shown.stdout.splitlines()[:2]
        assert name == host.name
        assert f" {host.address}/24 " in addr_line
        # The only route out of a host is its own subnet: nothing reaches the machine's network.
        routes = bed3.on_host(host.name, ["ip", "-o", "-4", "route"]).stdout.splitlines()
        assert [r.split()[0] for r in routes] == ["10.213.7.0/24"], routes
    # The root namespace never gets an address on the bed's subnet.
    root_addrs = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    assert "10.213.7." not in root_addrs


def test_teardown_removes_everything_even_after_a_failure(
    make_testbed: Callable[[int], TestBed],
) -> None:
    sleeper: subprocess.Popen[bytes] | None = None
    with pytest.raises(ZeroDivisionError):
        with testbed(2) as bed:
            name = bed.name
            assert any(ns.startswith(name) for ns in _our_netns())
            # A process left running on a host must not survive the teardown.
            sleeper = subprocess.Popen([str(AGENT), "--exec", "mnb", "sleep", "600"], env=bed.env())
            while not bed.pids("mnb"):
                time.sleep(0.05)
            1 / 0  # noqa: B018
    assert sleeper is not None and sleeper.wait(timeout=10) != 0
    assert not any(ns.startswith(name) for ns in _our_netns())
    assert not any(link.startswith(name) for link in _our_links())


def test_stale_beds_of_dead_processes_are_cleaned_and_live_ones_kept(
    make_testbed: Callable[[int], TestBed],
) -> None:
    live = make_testbed(1)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(gone.stdout)
    stale_netns, stale_bridge = f"mnf{dead_pid}q-mna", f"mnf{dead_pid}qbr"
    subprocess.run(["ip", "netns", "add", stale_netns], check=True)
    subprocess.run(["ip", "link", "add", stale_bridge, "type", "bridge"], check=True)
    removed = cleanup_stale()
    # Another pytest worker that builds a bed runs cleanup_stale too and may remove the stale
    # names before this call does (CI saw it): what must hold is that they are gone, by whichever
    # call, and that no call removed anything a live process owns.
    assert stale_netns not in _our_netns() and stale_bridge not in _our_links()
    assert live.hosts[0].netns in _our_netns() and live.bridge in _our_links()
    assert live.hosts[0].netns not in removed and live.bridge not in removed
    owners = [_owner_pid(name) for name in removed]
    assert all(owner is None or not _alive(owner) for owner in owners), removed


def test_agent_behaves_like_ssh(bed3: TestBed) -> None:
    """Open MPI hands the agent ssh options, a host and one shell string; unknown hosts fail
    with ssh's 255."""

    def agent(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(AGENT), *args], env=bed3.env(), capture_output=True, text=True, timeout=30
        )

    shell = agent("-x", "-o", "BatchMode=yes", "mnb", 'echo "two  spaces";', "hostname")
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.splitlines() == ["two  spaces", "mnb"]
    exact = agent("--exec", "mnc", "echo", "two  spaces; not a command")
    assert exact.stdout == "two  spaces; not a command\n"
    missing = agent("mnz", "true")
    assert missing.returncode == 255 and "no host 'mnz'" in missing.stderr
