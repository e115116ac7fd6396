"""Hosts and slots: hostfiles, ``--host`` lists, and the cores of this machine.

Hostfiles come in two dialects: Open MPI's ``node1 slots=4`` and MPICH's ``node1:4``; both are
read here so ``mnify doctor`` can say how many ranks a hostfile allows, and whether every host
name resolves. A host without a slot count
is kept with ``slots=None``: the MPI decides (usually one slot, or the cores it detects).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostSlots:
    """One host and the ranks it may run (``None``: not stated, the MPI decides)."""

    name: str
    slots: int | None


class HostSpecError(ValueError):
    """A hostfile line or ``--host`` entry that cannot be read."""


def _parse_slots(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise HostSpecError(f"{where}: slot count {text!r} is not a number") from None
    if value < 1:
        raise HostSpecError(f"{where}: slot count must be at least 1, got {value}")
    return value


def parse_hostfile_text(text: str, source: str = "hostfile") -> list[HostSlots]:
    """Hosts of a hostfile, in order; a host listed twice keeps one entry with the slots added."""
    slots_by_host: dict[str, int | None] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        fields = line.split()
        name, slots = fields[0], None
        if ":" in name:  # MPICH dialect: host:slots
            name, count = name.split(":", 1)
            slots = _parse_slots(count, where)
        for field in fields[1:]:
            key, _, value = field.partition("=")
            if key in ("slots", "cpu", "cpus") and value:
                slots = _parse_slots(value, where)
        if name in slots_by_host:
            previous = slots_by_host[name]
            slots_by_host[name] = (previous or 1) + (slots or 1)
        else:
            slots_by_host[name] = slots
    if not slots_by_host:
        raise HostSpecError(f"{source}: no hosts listed")
    return [HostSlots(name, slots) for name, slots in slots_by_host.items()]


def parse_hostfile(path: str | Path) -> list[HostSlots]:
    """Read a hostfile; raises :class:`HostSpecError` (also for a missing file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise HostSpecError(f"cannot read hostfile {path}: {exc.strerror or exc}") from None
    return parse_hostfile_text(text, str(path))


def parse_host_list(spec: str) -> list[HostSlots]:
    """``"node1:4,node2:4"`` (the ``--host`` syntax of both Open MPI and MPICH) -> hosts."""
    hosts: list[HostSlots] = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, count = entry.partition(":")
        if not name:
            raise HostSpecError(f"--host entry {entry!r} has no host name")
        hosts.append(HostSlots(name, _parse_slots(count, f"--host {entry}") if sep else None))
    if not hosts:
        raise HostSpecError("--host lists no hosts")
    return hosts


def total_slots(hosts: list[HostSlots]) -> int | None:
    """Sum of slots, or None when any host leaves its count to the MPI."""
    if any(h.slots is None for h in hosts):
        return None
    return sum(h.slots for h in hosts if h.slots is not None)


def physical_cores() -> int:
    """Cores this process may run on, counting hyper-threads once.

    Open MPI gives one slot per core by default, so this (not ``os.cpu_count()``) decides whether
    a one-host launch needs ``--oversubscribe``.
    """
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    for cpu in allowed:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return len(allowed) or 1
        cores.add((package, core))
    return len(cores) or 1


def this_host() -> HostSlots:
    """This machine, with its cores as slots (what a launch without hostfile sees)."""
    return HostSlots(socket.gethostname(), physical_cores())


@dataclass(frozen=True)
class Resolution:
    """What a host name resolves to on this machine: an address, or why not."""

    name: str
    address: str | None
    error: str = ""


def resolve_hosts(names: list[str], timeout: float = 5.0) -> list[Resolution]:
    """Resolve every name in parallel; a lookup slower than ``timeout`` counts as failed.

    mpiexec reaches each host by name (ssh, then its daemon's TCP connection back): a name that
    does not resolve here fails the launch with an ssh error buried in an MPI banner.
    """

    def lookup(name: str) -> Resolution:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            return Resolution(name, None, getattr(exc, "strerror", None) or str(exc))
        return Resolution(name, str(infos[0][4][0]) if infos else None)

    found: dict[str, Resolution] = {}

    def run(name: str) -> None:
        found[name] = lookup(name)

    # daemon threads: a lookup that hangs must not hold this process at exit either
    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    late = f"no answer within {timeout:g} s"
    return [found.get(name) or Resolution(name, None, late) for name in names]
