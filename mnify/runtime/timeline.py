"""Where the time goes: each rank's record of its collectives, buckets and optimizer updates.

``MNIFY_TIMELINE=DIR`` makes every rank record, for each collective, when it entered and left,
its bytes, the communicator and the collective's number, and the step (the optimizer's update
count); inside collectives each bucket of a reduction and each pack/unpack; the optimizer's
update and, within it, the wrapped optimizer applying the gradients. On a GPU communicator
CUDA events time the same spans on the device (host times only show the launches).
``mnify run --timeline FILE`` sets the variable, then merges the ranks' records into one Chrome
trace (:mod:`mnify.launch.timeline_merge`) and names stragglers (:mod:`mnify.launch.stragglers`).

Recording must be cheap and survive failure, so each rank writes into a file it has mapped into
memory (``DIR/rank-R.timeline``): a header, an append-only metadata area (JSON lines: the
process, names, communicators, clock offsets) and a ring of fixed-size event records. A
collective, point-to-point call or update is written when it begins (its end still open) and
its end stored when it ends: one ``pack_into`` and two word stores, no system call. The events
inside a collective (buckets, pack/unpack) cost two clock reads and a list append where they
happen and are written when the collective ends: in a pipelined reduction another rank spins
on this one's next bucket, and a few microseconds more per bucket there made the spinning
ranks give up their cores (bench/timeline.py). The kernel's page cache holds every store, so a
rank killed with SIGKILL leaves its completed events and the collective it was in (open, its
buckets lost); a rank that hangs leaves everything up to the watchdog's timeout, whose error
closes the event it was in.
When the ring is full the oldest events are overwritten (``mnify run --timeline-events``,
default 131072 per rank, 96 bytes each; the file is sparse).

How the events reach the recorder, without touching the hot paths when recording is off:
:func:`attach`, called once by every communicator's constructor, agrees with the other ranks
whether all of them record (one small allreduce at construction), and if so subscribes the
recorder's :class:`TimelineObserver` to the runtime's events (:mod:`mnify.runtime.observers`:
the communicators' calls and buckets, the pack/unpack kernels, the optimizers' updates).
Without ``MNIFY_TIMELINE`` nobody subscribes: each publishing point is a test of an empty list.

Clocks: events carry this rank's ``time.perf_counter_ns()`` (:data:`clock`). When a communicator
is attached, its rank 0 exchanges timestamps with each other rank (the round trip with the
shortest time wins) and each rank stores its clock's offset from rank 0's and the round trip
(half of it bounds the error); the merge removes the offsets.

Only the outermost collective of a nested call is recorded (``allreduce_grad`` calls
``multi_node_mean_grad``), numbered by the communicator's own count; collectives from several
threads at once are not supported (MPI's own thread level rarely allows them either). Nothing
here imports Chainer; mpi4py and numpy only when a communicator is attached.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import mmap
import os
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from mnify import environment
from mnify.runtime import observers
from mnify.runtime.observers import Observer, payload_bytes

DEFAULT_EVENTS: int = 1 << 17

MAGIC = int.from_bytes(b"MNTL", "little")
VERSION = 1
HEADER_BYTES = 4096
META_BYTES = 1 << 18
RECORD_WORDS = 12
RECORD_BYTES = RECORD_WORDS * 8
_RECORD = struct.Struct(f"={RECORD_WORDS}q")
# header words
_H_MAGIC, _H_VERSION, _H_CAPACITY, _H_HEAD, _H_META_USED, _H_META_DROPPED = range(6)
_H_STATE, _H_RANK, _H_PID, _H_DEVICE_DROPPED = range(6, 10)
# record words
_R_NUMBER, _R_START, _R_END, _R_NAME, _R_CAT, _R_COMM, _R_SEQ = range(7)
_R_STEP, _R_BYTES, _R_AUX, _R_FLAGS = range(7, 11)
OPEN = -1  # the end of an event still in progress
NO_COMM = -1

# the file's state word
RUNNING, EXITED = 1, 2

# event flags
FLAG_ERROR = 1  # left by an exception (a watchdog timeout, a mismatch, ...)
FLAG_SKIPPED = 2  # an update that ended without applying gradients (broadcast only)

# how many round trips rank 0 makes with each other rank to estimate its clock offset
SYNC_ROUNDS = 10
_SYNC_TAG = 0x6D6E74  # "mnt"


class Category(IntEnum):
    """What an event is; the merge names them (``cat`` in the trace)."""

    COLLECTIVE = 1  # a public collective of a communicator
    P2P = 2  # send/recv (not collective: not used for stragglers)
    BUCKET = 3  # one bucket of a reduction (aux: unused; seq: bucket number in the collective)
    PACK = 4  # kernels.pack into a staging buffer (aux: bucket number)
    UNPACK = 5  # kernels.unpack out of it (aux: bucket number)
    UPDATE = 6  # the multi-node optimizer's update()
    APPLY = 7  # the wrapped optimizer applying the averaged gradients
    DEVICE = 8  # GPU time of a span (aux: the category of the host span it times)
    # recorded only under ``mnify scale`` (:mod:`mnify.runtime.scale_probe`)
    STEP = 9  # one optimizer update as update_watch sees it (seq: its index, from 1)
    DATA = 10  # an iterator's ``next`` (aux: examples in the batch, -1 if unknown)
    EXTENSION = 11  # a Trainer extension's call (name: the extension's)
    RANK0 = 12  # a block of the script guarded by ``rank == 0`` (a rank-0-only branch)


# collectives whose payload is a model's parameters (their GPU time is always timed)
_MODEL_COLLECTIVES = frozenset(
    {"allreduce_grad", "bcast_data", "broadcast_data", "multi_node_mean_grad"}
)

clock: Callable[[], int] = time.perf_counter_ns
"""The recorder's clock (read when the recorder is made; tests replace it to skew a rank)."""


def enabled() -> bool:
    return environment.TIMELINE.is_set()


def capacity_from_env() -> int:
    """The ring's size: ``mnify run --timeline-events`` (in ``MNIFY_LAUNCH``), else the default."""
    return environment.LAUNCH.read().timeline_events or DEFAULT_EVENTS


def rank_file(directory: str | os.PathLike[str], rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.timeline"


def rank_of_file(path: Path) -> int | None:
    """The rank a file in a timeline directory belongs to, from its name; None if not one."""
    name = path.name
    if not (name.startswith("rank-") and name.endswith(".timeline")):
        return None
    digits = name[len("rank-") : -len(".timeline")]
    return int(digits) if digits.isdigit() else None


# -- writing ----------------------------------------------------------------------------------------


class Recorder:
    """One rank's timeline file, mapped into memory."""

    def __init__(
        self,
        path: Path,
        *,
        rank: int,
        size: int,
        host: str,
        capacity: int = DEFAULT_EVENTS,
        now: Callable[[], int] | None = None,
    ) -> None:
        self.path = path
        self.capacity = int(capacity)
        self.now = now if now is not None else clock
        total = HEADER_BYTES + META_BYTES + self.capacity * RECORD_BYTES
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, total)
            self._memory = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        self._words = memoryview(self._memory).cast("q")
        self._pack = _RECORD.pack_into
        self._ring = HEADER_BYTES + META_BYTES
        self._ring_word = self._ring // 8
        self.head = 0
        self._meta_used = 0
        self._names: dict[str, int] = {}
        # state the hooks share
        self.step = 0  # optimizer updates finished (or skipped) so far
        self.depth = 0  # inside a recorded collective
        self.bucket = 0  # number of the current bucket in the current collective
        self.comm = NO_COMM  # the current collective's communicator and number
        self.seq = 0
        self.device: DeviceSpans | None = None
        # events measured inside the current collective, written when it ends
        self.inner: list[tuple[int, ...]] = []
        self._update_at = -1
        self._apply_at = -1
        self._device_apply: Any = None
        words = self._words
        words[_H_VERSION] = VERSION
        words[_H_CAPACITY] = self.capacity
        words[_H_STATE] = RUNNING
        words[_H_RANK] = rank
        words[_H_PID] = os.getpid()
        words[_H_MAGIC] = MAGIC  # last: a reader sees a header only once it is whole
        self.meta(
            {
                "t": "process",
                "rank": rank,
                "size": size,
                "host": host,
                "pid": os.getpid(),
                "clock": "perf_counter_ns",
                "clock_at_start_ns": self.now(),
                "wall_at_start_ns": time.time_ns(),
                "capacity": self.capacity,
            }
        )

    # metadata: rare, never overwritten

    def meta(self, item: dict[str, Any]) -> None:
        """Append one JSON line to the metadata area (counted as dropped when it is full)."""
        raw = json.dumps(item, separators=(",", ":")).encode("utf-8") + b"\n"
        used = self._meta_used
        if used + len(raw) > META_BYTES:
            self._words[_H_META_DROPPED] += 1
            return
        self._memory[HEADER_BYTES + used : HEADER_BYTES + used + len(raw)] = raw
        self._meta_used = used + len(raw)
        self._words[_H_META_USED] = self._meta_used

    def name_id(self, name: str) -> int:
        found = self._names.get(name)
        if found is None:
            found = self._names[name] = len(self._names)
            self.meta({"t": "name", "id": found, "name": name})
        return found

    # events: the hot path

    def open(self, cat: int, name: int, comm: int, seq: int, nbytes: int, aux: int) -> int:
        """Begin an event now; returns its number (for :meth:`close`)."""
        n = self.head
        offset = self._ring + (n % self.capacity) * RECORD_BYTES
        self._pack(
            self._memory, offset, n + 1, self.now(), OPEN, name, cat, comm, seq, self.step,
            nbytes, aux, 0, 0,
        )  # fmt: skip
        self.head = n + 1
        self._words[_H_HEAD] = n + 1
        return n + 1

    def _word(self, number: int, index: int) -> int:
        """Where word ``index`` of event ``number`` lies; -1 once the ring has reused its slot."""
        at = self._ring_word + ((number - 1) % self.capacity) * RECORD_WORDS
        return at + index if self._words[at] == number else -1

    def close(self, number: int) -> None:
        """End event ``number`` now (unless the ring has overwritten it since)."""
        at = self._word(number, _R_END)
        if at >= 0:
            self._words[at] = self.now()

    def flag(self, number: int, flags: int) -> None:
        at = self._word(number, _R_FLAGS)
        if at >= 0:
            self._words[at] |= flags

    def set_bytes(self, number: int, nbytes: int) -> None:
        at = self._word(number, _R_BYTES)
        if at >= 0:
            self._words[at] = nbytes

    def add(
        self,
        cat: int,
        name: int,
        comm: int,
        seq: int,
        step: int,
        nbytes: int,
        aux: int,
        start: int,
        end: int,
        flags: int = 0,
    ) -> None:
        """A finished event measured elsewhere (inside a collective, or by the GPU)."""
        n = self.head
        offset = self._ring + (n % self.capacity) * RECORD_BYTES
        self._pack(
            self._memory, offset, n + 1, start, end, name, cat, comm, seq, step, nbytes, aux,
            flags, 0,
        )  # fmt: skip
        self.head = n + 1
        self._words[_H_HEAD] = n + 1

    def later(
        self,
        cat: int,
        name: int,
        comm: int,
        seq: int,
        nbytes: int,
        aux: int,
        start: int,
        end: int,
        flags: int = 0,
    ) -> None:
        """An event measured inside a collective: kept until the collective ends, then written
        (:meth:`flush_inner`). A reduction's critical path -- where another rank spins on this
        one's next bucket -- then pays two clock reads and an append per event, not a write."""
        if not self.depth:
            self.add(cat, name, comm, seq, self.step, nbytes, aux, start, end, flags)
            return
        inner = self.inner
        inner.append((cat, name, comm, seq, self.step, nbytes, aux, start, end, flags))
        if len(inner) >= self.capacity:
            self.flush_inner()

    def flush_inner(self) -> None:
        add = self.add
        for item in self.inner:
            add(*item)
        self.inner.clear()

    # the optimizer's update (see the module functions below)

    def update_begins(self, global_batch: int = 0, share: int = -1, micro_batches: int = 0) -> None:
        """An update begins; with a global-batch iterator, the step's global batch, this rank's
        share of it and the micro-batches it accumulated (kept in the record's nbytes, aux and
        seq fields, which an update has no other use for)."""
        if self._update_at >= 0:  # the last update returned early: it only broadcast
            self.flag(self._update_at, FLAG_SKIPPED)
            self.close(self._update_at)
            self._update_at = -1
            self.step += 1
        self._update_at = self.open(
            Category.UPDATE, self.name_id("update"), NO_COMM, micro_batches, global_batch, share
        )

    def apply_begins(self) -> None:
        self._apply_at = self.open(Category.APPLY, self.name_id("optimizer"), NO_COMM, 0, 0, -1)
        if self.device is not None:
            self._device_apply = self.device.begin(None)

    def update_ends(self) -> None:
        if self._apply_at >= 0:
            self.close(self._apply_at)
            if self.device is not None and self._device_apply is not None:
                self.device.end(
                    self._device_apply, None, Category.APPLY, self.name_id("optimizer"),
                    NO_COMM, 0, 0,
                )  # fmt: skip
                self._device_apply = None
            self._apply_at = -1
        if self._update_at >= 0:
            self.close(self._update_at)
            self._update_at = -1
        self.step += 1
        if self.device is not None:
            self.device.poll()

    def finish(self) -> None:
        """The process is exiting: time what the GPU still owes, mark the file as complete."""
        if self.device is not None:
            self.device.drain(2.0)
        self._words[_H_STATE] = EXITED
        self._memory.flush()


# -- GPU spans ------------------------------------------------------------------------------------


class DeviceSpans:
    """When the GPU ran what the host launched: a CUDA event before and after, read back later.

    ``cuda`` is ``cupy.cuda`` (tests pass a stand-in). Event pairs wait in a queue until the
    GPU has passed them; :meth:`poll` turns finished pairs into ``DEVICE`` events on the host's
    clock through an anchor: an event recorded on an idle stream and waited for, whose host
    time is taken around the wait. The anchor is renewed every ``reanchor_s`` seconds (when
    nothing is pending), so drift between the clocks stays small.
    """

    MAX_PENDING = 4096

    def __init__(self, recorder: Recorder, cuda: Any, reanchor_s: float = 30.0) -> None:
        self.recorder = recorder
        self.cuda = cuda
        self.reanchor_ns = int(reanchor_s * 1e9)
        self._free: list[Any] = []
        self._pending: deque[tuple[Any, ...]] = deque()
        self._idle = cuda.Stream(non_blocking=True)
        self._anchor()

    def _anchor(self) -> None:
        now = self.recorder.now
        event = self.cuda.Event()
        before = now()
        event.record(self._idle)
        event.synchronize()
        after = now()
        self._ref, self._ref_ns, self._anchored = event, (before + after) // 2, after

    def _event(self) -> Any:
        return self._free.pop() if self._free else self.cuda.Event(block=False)

    def begin(self, stream: Any) -> Any:
        """An event on ``stream`` (None: the current stream) marking where a span begins."""
        event = self._event()
        event.record(stream)
        return event

    def end(
        self, start: Any, stream: Any, cat: int, name: int, comm: int, seq: int, nbytes: int
    ) -> None:
        event = self._event()
        event.record(stream)
        rec = self.recorder
        self._pending.append((start, event, cat, name, comm, seq, rec.step, nbytes))
        if len(self._pending) > self.MAX_PENDING:
            self._pending.popleft()
            rec._words[_H_DEVICE_DROPPED] += 1

    def poll(self) -> None:
        """Write the spans the GPU has finished, oldest first."""
        pending, rec = self._pending, self.recorder
        if pending:
            elapsed, ref, base = self.cuda.get_elapsed_time, self._ref, self._ref_ns
            while pending and pending[0][1].done:
                start, end, cat, name, comm, seq, step, nbytes = pending.popleft()
                t0 = base + int(elapsed(ref, start) * 1e6)
                t1 = base + int(elapsed(ref, end) * 1e6)
                rec.add(Category.DEVICE, name, comm, seq, step, nbytes, cat, t0, t1)
                self._free += (start, end)
        if not pending and rec.now() - self._anchored > self.reanchor_ns:
            self._anchor()

    def drain(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the pending spans, then write them."""
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            if not self._pending[0][1].done:
                time.sleep(0.001)
            self.poll()


# -- the process's recorder and the hooks -------------------------------------------------------

_recorder: Recorder | None = None  # recording: a communicator's ranks all agreed to
_made: Recorder | None = None  # the file, made before the ranks compared notes
_observer: TimelineObserver | None = None  # subscribed once the first communicator attached
_comm_keys: dict[str, int] = {}  # communicators made so far per set of world ranks
_comm_count = 0


def recorder() -> Recorder | None:
    """This process's recorder, if it records."""
    return _recorder


def observes(comm: Any) -> bool:
    """Whether this process records ``comm``'s collectives."""
    return _observer is not None and _observer.observes(comm)


def _make(directory: str, rank: int, size: int, host: str) -> Recorder | None:
    """Make this process's timeline file (once); None, with a warning, if it cannot be made."""
    global _made
    if _made is not None:
        return _made
    try:
        _made = Recorder(
            rank_file(directory, rank), rank=rank, size=size, host=host,
            capacity=capacity_from_env(),
        )  # fmt: skip
    except OSError as exc:
        name = environment.TIMELINE.name
        sys.stderr.write(f"mnify: {name}={directory}: cannot record the timeline: {exc}\n")
        return None
    atexit.register(_finish)
    return _made


def _finish() -> None:
    if _made is not None:
        _made.finish()


def attach(comm: Any) -> bool:
    """Record ``comm``'s collectives if every one of its ranks records; True if so.

    Collective over ``comm``'s ranks (called by the communicator's constructor).
    """
    import numpy as np
    from mpi4py import MPI

    mpi_comm = comm.mpi_comm
    directory = environment.TIMELINE.read()
    want = directory is not None
    rec = None
    if directory is not None:
        world = MPI.COMM_WORLD
        rec = _make(directory, world.Get_rank(), world.Get_size(), comm.host_name)
    votes = np.array([int(want), int(rec is not None)], dtype=np.int64)
    mpi_comm.Allreduce(MPI.IN_PLACE, votes, op=MPI.SUM)
    size = mpi_comm.Get_size()
    if int(votes[1]) != size:
        # said once, by the lowest rank that wanted to record (every rank is here)
        first = mpi_comm.allreduce(comm.rank if want else size, op=MPI.MIN)
        if want and comm.rank == first:
            name = environment.TIMELINE.name
            sys.stderr.write(
                f"mnify: {name} is set on {int(votes[0])} of {size} ranks and usable on "
                f"{int(votes[1])}: not recording the timeline (every rank must record; "
                f"forward the variable to every host: mpiexec -x {name})\n"
            )
        return False
    assert rec is not None
    global _recorder, _observer
    _recorder = rec
    comm_id, members = _register(rec, comm, mpi_comm)
    _sync_clock(rec, mpi_comm, comm_id, members[0])
    if _observer is None:
        _observer = TimelineObserver(rec)
        observers.subscribe(_observer)
    _observer.add_comm(comm, comm_id)
    return True


def _register(rec: Recorder, comm: Any, mpi_comm: Any) -> tuple[int, list[int]]:
    """Describe ``comm`` in the metadata; returns its number in this process and its ranks'
    world ranks.

    Its ``key`` is the same on each of its ranks and differs from other communicators': a hash
    of its world ranks and how many communicators over the same ranks came before it.
    """
    from mpi4py import MPI

    size = mpi_comm.Get_size()
    world = MPI.COMM_WORLD.Get_group()
    group = mpi_comm.Get_group()
    try:
        members = [int(r) for r in MPI.Group.Translate_ranks(group, list(range(size)), world)]
    finally:
        group.Free()
        world.Free()
    global _comm_count
    digest = hashlib.sha1(",".join(map(str, members)).encode()).hexdigest()[:12]
    ordinal = _comm_keys.get(digest, 0)
    _comm_keys[digest] = ordinal + 1
    comm_id = _comm_count
    _comm_count += 1
    item: dict[str, Any] = {
        "t": "comm",
        "id": comm_id,
        "key": f"{digest}.{ordinal}",
        "class": getattr(comm, "name", type(comm).__name__),
        "rank": comm.rank,
        "size": size,
    }
    if size <= 1024:
        item["world_ranks"] = members
        hosts = getattr(getattr(comm, "topology", None), "host_of_rank", None)
        if hosts is not None:
            item["hosts"] = list(hosts)
    rec.meta(item)
    return comm_id, members


def _sync_clock(rec: Recorder, mpi_comm: Any, comm_id: int, world_rank0: int) -> None:
    """Estimate each rank's clock offset from the communicator's rank 0 (collective).

    Rank 0 sends its time to each other rank in turn and gets the other's back; of
    :data:`SYNC_ROUNDS` round trips the shortest gives the offset (the other's time minus the
    midpoint of the trip), good to half the trip. Rank 0 then tells the other rank the result,
    with its own process id and wall clock as the job's token.
    """
    import numpy as np

    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    now = rec.now
    job = np.array([os.getpid(), time.time_ns()], dtype=np.int64)
    if rank == 0:
        ping = np.zeros(1, dtype=np.int64)
        for peer in range(1, size):
            best = (1 << 62, 0, 0)
            for _ in range(SYNC_ROUNDS):
                t0 = now()
                ping[0] = t0
                mpi_comm.Send(ping, dest=peer, tag=_SYNC_TAG)
                mpi_comm.Recv(ping, source=peer, tag=_SYNC_TAG)
                t1 = now()
                if t1 - t0 < best[0]:
                    best = (t1 - t0, int(ping[0]) - (t0 + t1) // 2, int(ping[0]))
            result = np.array([best[1], best[0], best[2], job[0], job[1]], dtype=np.int64)
            mpi_comm.Send(result, dest=peer, tag=_SYNC_TAG)
        rec.meta({"t": "job", "comm": comm_id, "size": size, "token": [int(v) for v in job]})
        return
    ping = np.zeros(1, dtype=np.int64)
    for _ in range(SYNC_ROUNDS):
        mpi_comm.Recv(ping, source=0, tag=_SYNC_TAG)
        ping[0] = now()
        mpi_comm.Send(ping, dest=0, tag=_SYNC_TAG)
    result = np.zeros(5, dtype=np.int64)
    mpi_comm.Recv(result, source=0, tag=_SYNC_TAG)
    offset, rtt, at = (int(v) for v in result[:3])
    rec.meta(
        {
            "t": "clock",
            "comm": comm_id,
            "ref": world_rank0,
            "offset_ns": offset,
            "rtt_ns": rtt,
            "at_ns": at,
        }
    )
    rec.meta({"t": "job", "comm": comm_id, "size": size, "token": [int(v) for v in result[3:]]})


def _device_spans(rec: Recorder) -> DeviceSpans | None:
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        return DeviceSpans(rec, cupy.cuda)
    except Exception as exc:  # no usable device after all: host times only
        rec.meta({"t": "warning", "message": f"no CUDA event timing: {exc}"})
        return None


# -- the observer ---------------------------------------------------------------------------------


class _CommState:
    """What the timeline knows of one attached communicator."""

    __slots__ = ("comm", "comm_id", "device", "checked")

    def __init__(self, comm: Any, comm_id: int) -> None:
        self.comm = comm
        self.comm_id = comm_id
        self.device: DeviceSpans | None = None
        self.checked = False  # whether the communicator was looked at for a GPU

    def device_spans(self, rec: Recorder) -> DeviceSpans | None:
        """CUDA-event timing for a GPU communicator (one with a ``device_id``, which
        pure_nccl sets after the base constructor ran: looked at on the first collective)."""
        if not self.checked:
            self.checked = True
            if getattr(self.comm, "device_id", None) is not None:
                if rec.device is None:
                    rec.device = _device_spans(rec)
                self.device = rec.device
                if rec.device is not None:
                    rec.meta({"t": "device", "comm": self.comm_id})
        return self.device


class _Call:
    """The collective or point-to-point call in progress (only the outermost is published)."""

    __slots__ = ("at", "cat", "name", "comm_id", "seq", "nbytes", "device", "started", "stream")

    def __init__(
        self, at: int, cat: Category, name: int, comm_id: int, seq: int, nbytes: int
    ) -> None:
        self.at, self.cat, self.name, self.comm_id = at, cat, name, comm_id
        self.seq, self.nbytes = seq, nbytes
        self.device: DeviceSpans | None = None
        self.started: Any = None
        self.stream: Any = None


class TimelineObserver(Observer):
    """Writes the runtime's events (:mod:`mnify.runtime.observers`) into the recorder: the
    attached communicators' calls, the buckets inside them, every pack/unpack, the updates."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.comms: dict[int, _CommState] = {}
        self.call: _Call | None = None
        self._bucket_depth = 0
        self._bucket_start = 0
        self._bucket_number = 0
        self._kernel: tuple[int, Any] | None = None
        self._overlap: list[tuple[int, int, int]] = []  # (bucket, bytes, start) this step
        self._bucket_name = rec.name_id("bucket")

    def add_comm(self, comm: Any, comm_id: int) -> None:
        self.comms[id(comm)] = _CommState(comm, comm_id)

    def observes(self, comm: Any) -> bool:
        state = self.comms.get(id(comm))
        return state is not None and state.comm is comm

    def _state(self, comm: Any) -> _CommState | None:
        state = self.comms.get(id(comm))
        return state if state is not None and state.comm is comm else None

    # calls

    def collective_enters(
        self,
        comm: Any,
        kind: str,
        seq: int,
        nbytes: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        state = self._state(comm)
        if state is None:
            return
        rec = self.rec
        name = rec.name_id(kind)
        call = self._open(state, Category.COLLECTIVE, name, seq, nbytes, -1)
        device = state.device if state.checked else state.device_spans(rec)
        if device is not None and (kind in _MODEL_COLLECTIVES or _device_payload(args)):
            call.device, call.stream = device, kwargs.get("stream")
            call.started = device.begin(call.stream)

    def point_to_point_enters(
        self, comm: Any, kind: str, seq: int, peer: int, args: tuple[Any, ...]
    ) -> None:
        state = self._state(comm)
        if state is not None:
            self._open(
                state, Category.P2P, self.rec.name_id(kind), seq, payload_bytes(kind, args), peer
            )

    def _open(
        self, state: _CommState, cat: Category, name: int, seq: int, nbytes: int, aux: int
    ) -> _Call:
        rec = self.rec
        rec.depth, rec.comm, rec.seq, rec.bucket = 1, state.comm_id, seq, 0
        at = rec.open(cat, name, state.comm_id, seq, nbytes, aux)
        self._bucket_number = 0
        self.call = _Call(at, cat, name, state.comm_id, seq, nbytes)
        return self.call

    def collective_leaves(self, comm: Any, kind: str, seq: int, failed: bool, result: Any) -> None:
        self._close(failed)

    def point_to_point_leaves(
        self, comm: Any, kind: str, seq: int, failed: bool, result: Any
    ) -> None:
        if self.call is not None and kind == "recv" and not failed:
            self.rec.set_bytes(self.call.at, int(getattr(result, "nbytes", 0) or 0))
        self._close(failed)

    def _close(self, failed: bool) -> None:
        call, rec = self.call, self.rec
        if call is None:
            return
        self.call = None
        if failed:
            rec.flag(call.at, FLAG_ERROR)
        rec.close(call.at)
        rec.depth = 0
        rec.comm = NO_COMM
        if rec.inner:
            rec.flush_inner()
        if call.device is not None and call.started is not None:
            call.device.end(
                call.started, call.stream, call.cat, call.name, call.comm_id, call.seq, call.nbytes
            )
            call.device.poll()

    # inside a call

    def bucket_begins(self, nbytes: int) -> None:
        if self.call is None:
            return
        self._bucket_depth += 1
        if self._bucket_depth == 1:  # only the outermost of nested buckets
            self._bucket_number += 1
            self.rec.bucket = self._bucket_number
            self._bucket_start = self.rec.now()

    def bucket_ends(self, nbytes: int, failed: bool) -> None:
        if self.call is None or not self._bucket_depth:
            return
        self._bucket_depth -= 1
        if self._bucket_depth == 0:
            rec, call = self.rec, self.call
            rec.later(
                Category.BUCKET, self._bucket_name, call.comm_id, self._bucket_number, nbytes,
                call.seq, self._bucket_start, rec.now(), FLAG_ERROR if failed else 0,
            )  # fmt: skip

    def kernel_begins(self, kind: str, buffer: Any) -> None:
        device = self.rec.device
        started = device.begin(None) if device is not None and _on_device(buffer) else None
        self._kernel = (self.rec.now(), started)

    def kernel_ends(self, kind: str, buffer: Any) -> None:
        if self._kernel is None:
            return
        start, started = self._kernel
        self._kernel = None
        rec = self.rec
        end = rec.now()
        cat = Category.PACK if kind == "pack" else Category.UNPACK
        name = rec.name_id(kind)
        nbytes = int(getattr(buffer, "nbytes", 0))
        rec.later(cat, name, rec.comm, rec.seq, nbytes, rec.bucket, start, end)
        if started is not None and rec.device is not None:
            rec.device.end(started, None, cat, name, rec.comm, rec.seq, nbytes)

    def overlap_bucket_starts(self, number: int, nbytes: int) -> None:
        self._overlap.append((number, nbytes, self.rec.now()))

    def overlap_buckets_done(self) -> None:
        """One ``overlap bucket`` event per bucket, from its start (in backward, or at wait) to
        the end of the wait that completed it (a non-blocking reduction's own end is not
        observed). Written now, outside any collective: a few stores per bucket."""
        if not self._overlap:
            return
        rec = self.rec
        end = rec.now()
        name = rec.name_id("overlap bucket")
        for number, nbytes, start in self._overlap:
            rec.add(Category.BUCKET, name, NO_COMM, number + 1, rec.step, nbytes, -1, start, end)
        self._overlap.clear()

    # the optimizer

    def update_begins(self, optimizer: Any) -> None:
        # the global-batch iterator's record, if that (Chainer-facing) module is in use at all:
        # looked up, not imported, so the timeline never imports Chainer
        global_step = sys.modules.get("mnify.runtime.iterators.global_step")
        comm = getattr(optimizer, "communicator", None)
        if global_step is None or comm is None:
            self.rec.update_begins()
            return
        step = global_step.latest(comm.size, comm.rank)
        if step is None:
            self.rec.update_begins()
        else:
            self.rec.update_begins(step.global_batch, step.share, global_step.micro_batches())

    def apply_begins(self, optimizer: Any) -> None:
        self.rec.apply_begins()

    def update_ends(self, optimizer: Any) -> None:
        self.rec.update_ends()


def _on_device(x: Any) -> bool:
    return type(x).__module__.split(".", 1)[0] == "cupy"


def _device_payload(args: tuple[Any, ...]) -> bool:
    """Whether a collective's first argument (an array or a list of arrays) is on a GPU."""
    if not args:
        return False
    x = args[0]
    if isinstance(x, list | tuple):
        return bool(x) and _on_device(x[0])
    return _on_device(x)


# -- reading ------------------------------------------------------------------------------------


_CATEGORIES = [int(c) for c in Category]


class TimelineFileError(Exception):
    """A file that is not a readable timeline."""


@dataclass
class Event:
    """One recorded event, in the rank's own clock (nanoseconds)."""

    start: int
    end: int | None  # None: still open when the file was read (the rank died or hangs)
    name: str
    cat: Category
    comm: int
    seq: int
    step: int
    nbytes: int
    aux: int
    flags: int


@dataclass
class RankTimeline:
    """What one rank's file holds."""

    path: Path
    rank: int
    pid: int
    exited: bool  # the process ended normally (atexit ran)
    capacity: int
    written: int  # events ever written; more than capacity means the oldest were overwritten
    events: list[Event]
    process: dict[str, Any]
    comms: dict[int, dict[str, Any]]
    clocks: list[dict[str, Any]]  # offsets from another rank's clock
    jobs: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    dropped_meta: int = 0
    dropped_device: int = 0
    damaged: int = 0  # records skipped because they did not read back whole

    @property
    def size(self) -> int:
        return int(self.process.get("size", 0))

    @property
    def host(self) -> str:
        return str(self.process.get("host", ""))


def read_file(path: str | os.PathLike[str]) -> RankTimeline:
    """Read one rank's timeline file (of a running, finished or killed process)."""
    import numpy as np

    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TimelineFileError(f"{path}: {exc.strerror or exc}") from exc
    if len(raw) < HEADER_BYTES + META_BYTES:
        raise TimelineFileError(f"{path}: too short to be a timeline ({len(raw)} bytes)")
    header = struct.unpack_from("=10q", raw)
    if header[_H_MAGIC] != MAGIC:
        raise TimelineFileError(f"{path}: not a timeline file (bad magic)")
    if header[_H_VERSION] != VERSION:
        raise TimelineFileError(f"{path}: timeline format {header[_H_VERSION]}, expected {VERSION}")
    capacity, head = int(header[_H_CAPACITY]), int(header[_H_HEAD])
    ring = HEADER_BYTES + META_BYTES
    if capacity <= 0 or len(raw) < ring + capacity * RECORD_BYTES:
        raise TimelineFileError(f"{path}: truncated (capacity {capacity} events)")
    names: dict[int, str] = {}
    comms: dict[int, dict[str, Any]] = {}
    clocks: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    warnings: list[str] = []
    process: dict[str, Any] = {}
    used = min(int(header[_H_META_USED]), META_BYTES)
    for line in raw[HEADER_BYTES : HEADER_BYTES + used].splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        kind = item.get("t")
        if kind == "name":
            names[int(item["id"])] = str(item["name"])
        elif kind == "comm":
            comms[int(item["id"])] = item
        elif kind == "clock":
            clocks.append(item)
        elif kind == "job":
            jobs.append(item)
        elif kind == "process":
            process = item
        elif kind == "warning":
            warnings.append(str(item.get("message", "")))

    events: list[Event] = []
    # when the ring has wrapped, the oldest slot may be the one a killed writer was overwriting
    first = max(0, head - capacity + 1) if head >= capacity else 0
    numbers = np.arange(first, head, dtype=np.int64)
    table = np.frombuffer(raw, dtype=np.int64, count=capacity * RECORD_WORDS, offset=ring)
    rows = table.reshape(capacity, RECORD_WORDS)[numbers % capacity]
    whole = (rows[:, _R_NUMBER] == numbers + 1) & np.isin(rows[:, _R_CAT], _CATEGORIES)
    damaged = int(np.count_nonzero(~whole))
    categories = {int(c): c for c in Category}
    for _, start, end, name, cat, comm, seq, step, nbytes, aux, flags, _ in rows[whole].tolist():
        events.append(
            Event(
                start=start,
                end=None if end == OPEN else end,
                name=names.get(name, f"#{name}"),
                cat=categories[cat],
                comm=comm,
                seq=seq,
                step=step,
                nbytes=nbytes,
                aux=aux,
                flags=flags,
            )
        )
    return RankTimeline(
        path=path,
        rank=int(header[_H_RANK]),
        pid=int(header[_H_PID]),
        exited=header[_H_STATE] == EXITED,
        capacity=capacity,
        written=head,
        events=events,
        process=process,
        comms=comms,
        clocks=clocks,
        jobs=jobs,
        warnings=warnings,
        dropped_meta=int(header[_H_META_DROPPED]),
        dropped_device=int(header[_H_DEVICE_DROPPED]),
        damaged=damaged,
    )
