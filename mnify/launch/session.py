"""The job's processes as one unit: mpiexec's session, signalled and swept together.

``mnify run`` starts mpiexec as the leader of a new session. Open MPI's launcher puts each rank
in a process group of its own, so signalling mpiexec's process group misses the ranks; every
process it starts stays in its session, though, unless it leaves on purpose (``setsid``). On
Linux the members are found in ``/proc``; elsewhere only the process group can be reached.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first)."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[-1].split()


def session_members(sid: int) -> list[int]:
    """Live processes (zombies aside) of session ``sid``; [] where ``/proc`` is unavailable."""
    members = []
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        # fields: state ppid pgrp session ...
        if fields is None or len(fields) < 4 or fields[0] in ("Z", "X"):
            continue
        if int(fields[3]) == sid:
            members.append(int(entry))
    return sorted(members)


def signal_session(sid: int, sig: int) -> None:
    """Send ``sig`` to every member of session ``sid`` and to its leader's process group."""
    try:
        os.killpg(sid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in session_members(sid):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_leader(pid: int, sig: int) -> None:
    """Send ``sig`` to the session leader's process group (mpiexec and its threads)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_session(sid: int) -> None:
    """SIGKILL whatever is left of session ``sid``."""
    signal_session(sid, signal.SIGKILL)
