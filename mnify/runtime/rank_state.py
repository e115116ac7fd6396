"""Where this rank is, for ``mnify run``: doing its own work, waiting inside MPI, or exiting.

A rank that leaves early (``sys.exit``, a ``return`` only it takes) blocks in ``MPI_Finalize``
while the others wait for it in their next collective: the job hangs with no error anywhere. The
launcher can only end such a job if it knows both facts, so each rank publishes them here.

Under ``mnify run`` the launcher names a directory and its host (``rank_state_dir`` and
``rank_state_host`` in ``MNIFY_LAUNCH``, :class:`mnify.environment.LaunchWiring`); the
bootstrap calls :func:`start`, which maps a small file ``rank-R`` in that directory and
subscribes to the runtime's events (:mod:`mnify.runtime.observers`): from then on each
collective's start and each wait inside MPI write the rank's state into that memory, two
stores around each wait, no system call. Ranks on another host (whose directory
the launcher cannot read) and processes not started by ``mnify run`` subscribe nothing.

The record (80 bytes, native byte order, as the launcher runs on the same host): six 64-bit
words, magic ``MNRS``, phase, waits begun, collective number, exit status and pid, then the
collective's name (32 bytes, NUL padded). Words are written through a ``memoryview``: one store
each.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from mnify import environment
from mnify.runtime import observers
from mnify.runtime.observers import Observer

# the world rank as each MPI's launcher exports it, in order of preference
RANK_ENVS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")

MAGIC = int.from_bytes(b"MNRS", "little")
_RECORD = struct.Struct("=6q32s")
RECORD_BYTES = _RECORD.size
# word indices
_MAGIC, _PHASE, _WAITS, _SEQ, _STATUS, _PID = range(6)
_NAME_AT, _NAME_BYTES = 48, 32


class Phase(IntEnum):
    """What the rank is doing; ``UNKNOWN`` for a record not yet written."""

    UNKNOWN = 0
    RUNNING = 1  # its own work: Python code, computation, I/O
    WAITING = 2  # inside an MPI call of a collective or a receive
    EXITING = 3  # the script ended (blocked in MPI_Finalize, under mpi4py)


# plain ints: storing an IntEnum member into a memoryview costs a conversion each time
_RUNNING, _WAITING, _EXITING = int(Phase.RUNNING), int(Phase.WAITING), int(Phase.EXITING)


@dataclass(frozen=True)
class RankRecord:
    """One rank's record, as the launcher reads it."""

    rank: int
    phase: Phase
    waits: int  # how many MPI waits it has begun: a stuck wait keeps its number
    seq: int  # the number of the collective it entered last (per communicator)
    kind: str  # that collective's name
    status: int  # exit status, once EXITING
    pid: int


def record_path(directory: str | os.PathLike[str], rank: int) -> Path:
    return Path(directory) / f"rank-{rank}"


def read_record(path: Path, rank: int) -> RankRecord | None:
    """The record in ``path``; None when missing, short or not a record."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < RECORD_BYTES:
        return None
    magic, phase, waits, seq, status, pid, kind = _RECORD.unpack_from(raw)
    if magic != MAGIC:
        return None
    try:
        known = Phase(phase)
    except ValueError:
        known = Phase.UNKNOWN
    name = kind.rstrip(b"\0").decode("utf-8", errors="replace")
    return RankRecord(rank, known, waits, seq, name, status, pid)


class StateFile:
    """A rank's record, mapped into memory: every write is a store, not a system call."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, RECORD_BYTES)
            self.memory = mmap.mmap(fd, RECORD_BYTES)
        finally:
            os.close(fd)
        _RECORD.pack_into(self.memory, 0, MAGIC, Phase.RUNNING, 0, 0, 0, os.getpid(), b"")
        self._bytes = memoryview(self.memory)
        self._words = self._bytes[:_NAME_AT].cast("q")
        self.waits = 0
        self._kind = ""

    def entered(self, kind: str, seq: int) -> None:
        self._words[_SEQ] = seq
        if kind != self._kind:  # the same collective again (every step): no copy
            self._kind = kind
            self._bytes[_NAME_AT:] = kind.encode("utf-8")[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0")

    def wait_begins(self) -> None:
        self.waits += 1
        self._words[_WAITS] = self.waits
        self._words[_PHASE] = _WAITING

    def wait_ends(self) -> None:
        self._words[_PHASE] = _RUNNING

    def exiting(self, status: int) -> None:
        self._words[_STATUS] = status
        self._words[_PHASE] = _EXITING

    def close(self) -> None:
        self._words.release()
        self._bytes.release()
        self.memory.close()


class _Publisher(Observer):
    """Writes the runtime's events (:mod:`mnify.runtime.observers`) into the rank's record."""

    def __init__(self, record: StateFile) -> None:
        self.record = record

    def collective_enters(
        self,
        comm: Any,
        kind: str,
        seq: int,
        nbytes: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.record.entered(kind, seq)

    def point_to_point_enters(
        self, comm: Any, kind: str, seq: int, peer: int, args: tuple[Any, ...]
    ) -> None:
        self.record.entered(kind, seq)

    def wait_begins(self) -> None:
        self.record.wait_begins()

    def wait_ends(self) -> None:
        self.record.wait_ends()


_record: StateFile | None = None
_unsubscribe: Callable[[], None] | None = None


def world_rank_from_env() -> int | None:
    for name in RANK_ENVS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def start() -> bool:
    """Publish this rank's state if ``mnify run`` asked for it and can read it; True if so.

    Called once by the bootstrap, before the script runs. Child processes never call it, so a
    worker forked or spawned by the script does not speak for the rank. The record follows
    the runtime's events through :func:`mnify.runtime.observers.subscribe`.
    """
    global _record, _unsubscribe
    if _record is not None:
        return True
    wiring = environment.LAUNCH.read()
    directory = wiring.rank_state_dir
    rank = world_rank_from_env()
    if not directory or rank is None or not os.path.isdir(directory):
        return False
    if wiring.rank_state_host != socket.gethostname():
        return False  # a directory of the same name on another host, or a shared file system
    try:
        _record = StateFile(record_path(directory, rank))
    except OSError:
        return False
    _unsubscribe = observers.subscribe(_Publisher(_record))
    return True


def stop() -> None:
    """Stop publishing (the record keeps its last state)."""
    global _record, _unsubscribe
    if _unsubscribe is not None:
        _unsubscribe()
        _unsubscribe = None
    if _record is not None:
        _record.close()
        _record = None


def exiting(status: int) -> None:
    """The rank's script is over with ``status``; what follows is MPI's finalisation."""
    if _record is not None:
        _record.exiting(status)
