"""Averaging buckets through a shared-memory segment when every rank runs on one host.

An MPI Allreduce followed by the 1/size pass goes over the gradients in memory twice; on one
host the mean can be a reduce-scatter plus an all-gather inside a segment every rank maps:

1. publish: each rank writes its bucket, cast to the wire dtype, into its own input slot, then
   raises its ``published`` counter;
2. reduce its share: once every rank has published, rank r sums only its 1/size share of the
   bucket over all input slots into the shared result slot (one pass, the 1/size scale applied
   to the share just summed, while it is in cache), then raises its ``reduced`` counter;
3. gather: once every rank has reduced, every rank copies the whole result into its gradients.

The scale follows :func:`~mnify.runtime.communicators.buckets.place_scale`, as on the GPU: the
share reduction averages on float32/float64 wires (like NCCL's ``ncclAvg``); float16 buckets
are scaled while publishing, before the sum, so float16 sums cannot overflow. A bucket that is
one piece of the wire dtype (a slice of a large array, most of the bytes) and needs no scale
before the sum skips two copies: the rank publishes only the other ranks' shares, sums its own
share straight from (and into) the piece, and copies back only the other shares.

Each element is summed by exactly one rank, so all ranks get bit-identical results. Ranks
synchronise through sequence counters in the segment (one cache line each; a rank waits by
spinning briefly, then yielding the CPU, then sleeping in short steps, so ranks that outnumber
the cores do not starve the rank they wait for) instead of an MPI barrier per bucket. Buckets
alternate between two sets of slots and are pipelined: right after reducing its share of
bucket k a rank publishes bucket k + 1, and only then waits -- once per bucket: every rank
raises ``reduced`` for bucket k before ``published`` for bucket k + 1, so seeing every rank's
``published`` reach bucket k + 1 means bucket k's result is complete and bucket k + 1 can be
reduced. That is also what makes reusing the slots safe: a rank publishes bucket k + 1 into
the slots of bucket k - 1 after every rank has published bucket k (so has reduced bucket
k - 1), and writes its share of bucket k into the result slot of bucket k - 2 after every rank
has published bucket k, which each does after copying out bucket k - 2.

The counters rely on stores becoming visible to other cores in program order (x86-64's TSO:
the data before the counter that announces it). Elsewhere each wait is an MPI barrier instead,
which orders memory itself; under the watchdog a counter wait has the collective's deadline.

The hierarchical communicator uses the same segment per host with its result slot: the host's
leader sums into it and all-reduces it with the other leaders; barriers separate the stages
(:meth:`SharedMemoryReducer.mean_through_leader`).

The segment is a file under ``/dev/shm`` (or the temporary directory), created by rank 0 with
its space reserved up front (``posix_fallocate``: a full tmpfs fails here instead of crashing
later with SIGBUS), mapped by every rank and unlinked at once, so nothing outlives the job.
"""

from __future__ import annotations

import mmap
import os
import platform
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
from mpi4py import MPI

from mnify import environment
from mnify.runtime import kernels, observers
from mnify.runtime.communicators.buckets import ScalePlacement, place_scale


def enabled_by_env() -> bool:
    """``MNIFY_SHARED_MEMORY`` is not 0 (0: MPI Allreduce instead of the segment)."""
    return environment.SHARED_MEMORY.read()


SEGMENT_BUDGET = 32 << 20
# Slots small enough that a bucket stays in cache between publishing, reducing and copying out,
# large enough that per-bucket overhead and waits stay few. ResNet-50's gradients (97.5 MiB),
# AMD EPYC with 1 MiB L2 per core: one rank's own work (the other rank always ahead, so no
# waiting), best of 7, ms, against 7.8 ms for one memcpy of the gradients:
#   slot      256 KiB  512 KiB  1 MiB  2 MiB  4 MiB
#   work        15.4     14.2    13.1   13.6   17.5
# bench/allreduce.py, 2 ranks, best of 11 (a loaded machine, load 6): 63.4 / 45.8 / 59.5 ms for
# 512 KiB / 1 MiB / 2 MiB slots.
SLOT_CAP = 1 << 20

# Stores become visible to other cores in program order (TSO): counters can announce data.
ORDERED_STORES = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")

_PUBLISHED, _REDUCED = 0, 1  # the two counters of each rank
_LINE = 64  # bytes per counter (one cache line each, so ranks never write a shared line)
_PAGE = 4096
# Waiting: this many counter reads back to back, then sched_yield() until _YIELD_FOR seconds
# have passed, then sleeps doubling from _FIRST_SLEEP up to _MAX_SLEEP.
_SPINS = 64
_YIELD_FOR = 2e-3
_FIRST_SLEEP = 2e-5
_MAX_SLEEP = 1e-3
_yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))


class Deadline(Protocol):
    """What a counter wait needs from the watchdog: its timeout and the error to raise."""

    timeout: float

    def timeout_error(self) -> BaseException: ...


def slot_size(bucket_bytes: int, size: int) -> int:
    """A bucket's bytes, at most ``SLOT_CAP``, and less when a segment for ``size`` ranks (two
    parities of ``size + 1`` slots) would exceed ``SEGMENT_BUDGET`` (containers often give
    /dev/shm only 64 MiB). A multiple of 64 bytes (cache lines, any dtype's alignment) unless
    buckets are smaller."""
    limit = min(SLOT_CAP, SEGMENT_BUDGET // (2 * (size + 1)))
    if bucket_bytes <= limit:
        return bucket_bytes
    return max(64, limit // 64 * 64)


def _segment_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _header_bytes(size: int) -> int:
    """Two counters per rank, a cache line each, rounded up to a page."""
    return -(-2 * size * _LINE // _PAGE) * _PAGE


def share_bounds(n: int, size: int, itemsize: int) -> list[int]:
    """``size + 1`` boundaries cutting ``n`` elements into near-equal shares that start on cache
    lines (so no two ranks write the same line of the result)."""
    step = max(1, _LINE // itemsize)
    return [min(n, (n * q // size) // step * step) if q < size else n for q in range(size + 1)]


def sum_in_rank_order(
    parts: Sequence[np.ndarray], out: np.ndarray, spare: np.ndarray | None = None
) -> None:
    """``out = ((parts[0] + parts[1]) + parts[2]) + ...``, the order every path of a host
    sums in (at least two parts). ``out`` may be one of ``parts`` (a rank summing into its own
    values: they are read before they are overwritten, using that ``a + b == b + a``
    exactly); then ``spare``, of the same shape, aliasing none of them, is needed."""
    k = next((i for i, p in enumerate(parts) if p is out), None)
    if k is None or k <= 1:
        np.add(parts[0], parts[1], out=out)
        for p in parts[2:]:
            np.add(out, p, out=out)
        return
    assert spare is not None, "summing into parts[k >= 2] needs a spare buffer"
    np.add(parts[0], parts[1], out=spare)
    for p in parts[2:k]:
        np.add(spare, p, out=spare)
    np.add(spare, out, out=out)
    for p in parts[k + 1 :]:
        np.add(out, p, out=out)


class _Bucket:
    """One bucket on its way through the segment: its pieces, its slots (every rank's input
    row, then the result row), this rank's share and where the scale goes. ``direct``: the
    bucket is one piece of the wire dtype whose scale is not needed before the sum, so it is
    read and written in place."""

    __slots__ = ("views", "slots", "share", "placement", "k", "scale", "direct")

    def __init__(
        self,
        views: list[np.ndarray],
        slots: np.ndarray,
        share: tuple[int, int],
        placement: ScalePlacement,
        k: int,
        scale: float,
    ) -> None:
        self.views, self.slots, self.share = views, slots, share
        self.placement, self.k, self.scale = placement, k, scale
        one_piece = len(views) == 1 and views[0].dtype == slots.dtype
        self.direct = views[0] if one_piece and placement.before == 1.0 else None


class SharedMemoryReducer:
    """Bucket means across the ranks of ``comm``, all of which share one host's memory."""

    def __init__(self, segment: mmap.mmap, rank: int, size: int, slot_bytes: int) -> None:
        self._segment = segment
        self.rank = rank
        self.size = size
        self.slot_bytes = slot_bytes
        header = _header_bytes(size)
        # published[q] at line q, reduced[q] at line size + q (int64 each)
        self._counters = memoryview(segment)[:header].cast("q")
        self._stride = _LINE // 8
        raw = np.frombuffer(segment, dtype=np.uint8, offset=header)
        # per parity: one input slot per rank, then the result slot
        self._slots = raw.reshape(2, size + 1, slot_bytes)
        self._typed: dict[tuple[int, str], np.ndarray] = {}  # (parity, dtype) -> typed slots
        self._shares: dict[tuple[int, int], tuple[int, int]] = {}
        self._parity = 0  # mean_through_leader's alternation
        self._buckets = 0  # buckets averaged by mean_buckets (the same count on every rank)
        self.ordered_stores = ORDERED_STORES

    @classmethod
    def create(cls, comm: MPI.Intracomm, slot_bytes: int) -> SharedMemoryReducer | None:
        """Collective. None when the ranks span several hosts or no segment could be made (then
        callers reduce over MPI). Callers cut buckets to ``slot_bytes`` (see :func:`slot_size`)."""
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        together = node.Get_size() == comm.Get_size()
        node.Free()
        if not together:
            return None
        rank, size = comm.Get_rank(), comm.Get_size()
        nbytes = _header_bytes(size) + 2 * (size + 1) * slot_bytes
        path = None
        if rank == 0:
            path = os.path.join(_segment_dir(), f"mnify-{os.getpid()}-{uuid.uuid4().hex[:12]}")
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.posix_fallocate(fd, 0, nbytes)  # zero-filled: every counter starts at 0
                finally:
                    os.close(fd)
            except OSError:
                if os.path.exists(path):
                    os.unlink(path)
                path = None
        path = comm.bcast(path, root=0)
        if path is None:
            return None
        segment: mmap.mmap | None = None
        try:
            fd = os.open(path, os.O_RDWR)
            try:
                segment = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
        except OSError:
            segment = None
        everyone = comm.allreduce(segment is not None, op=MPI.LAND)
        if rank == 0:
            os.unlink(path)  # every rank has it mapped (or gave up): the name is no longer needed
        if not everyone:
            if segment is not None:
                segment.close()
            return None
        assert segment is not None
        return cls(segment, rank, size, slot_bytes)

    # -- the mean of every rank's buckets ----------------------------------------------------------

    def mean(
        self,
        views: Sequence[np.ndarray],
        buf: np.ndarray,
        scale: float,
        barrier: Callable[[], None],
    ) -> None:
        """One bucket's :meth:`mean_buckets`."""
        self.mean_buckets([(list(views), buf)], scale, barrier)

    def mean_buckets(
        self,
        buckets: Iterable[tuple[list[np.ndarray], np.ndarray]],
        scale: float,
        barrier: Callable[[], None],
        deadline: Deadline | None = None,
    ) -> None:
        """Replace each bucket's pieces (1-D views) by their sum over ranks times ``scale``.

        ``buckets``: per bucket, its pieces and a buffer whose dtype is the wire dtype and whose
        size (the pieces' total) fits a slot; every rank passes the same sequence. ``barrier``
        synchronises all ranks where stores are not ordered (see the module doc); ``deadline``
        (the watchdog) bounds each counter wait. Each bucket is published to the observers
        from taking it to taking the next (:class:`mnify.runtime.observers.BucketStream`).
        """
        stream = observers.bucket_stream(buckets, _bucket_nbytes)
        if stream is None:
            self._mean_buckets(buckets, scale, barrier, deadline)
            return
        with stream:
            self._mean_buckets(stream, scale, barrier, deadline)

    def _mean_buckets(
        self,
        buckets: Iterable[tuple[list[np.ndarray], np.ndarray]],
        scale: float,
        barrier: Callable[[], None],
        deadline: Deadline | None,
    ) -> None:
        queue = iter(buckets)
        first = next(queue, None)
        if first is None:
            return
        k = self._buckets
        started = time.monotonic()
        opening = self._bucket(first, k, scale)
        self._publish(opening)
        current: _Bucket | None = opening
        self._wait(_PUBLISHED, k + 1, barrier, deadline, started)
        while current is not None:
            self._reduce_share(current)
            self._raise(_REDUCED, k + 1)
            following = next(queue, None)
            upcoming = None if following is None else self._bucket(following, k + 1, scale)
            if upcoming is not None:
                # overlaps the others' reductions; a rank publishes bucket k + 1 only after
                # reducing bucket k, so one wait covers both
                self._publish(upcoming)
                self._wait(_PUBLISHED, k + 2, barrier, deadline, started)
            else:
                self._wait(_REDUCED, k + 1, barrier, deadline, started)
            self._copy_out(current)
            current = upcoming
            k += 1
        self._buckets = k

    def _typed_slots(self, parity: int, wire: np.dtype[Any]) -> np.ndarray:
        key = (parity, wire.str)
        typed = self._typed.get(key)
        if typed is None:
            usable = self.slot_bytes // wire.itemsize * wire.itemsize
            typed = self._slots[parity, :, :usable].view(wire)
            self._typed[key] = typed
        return typed

    def _bucket(self, bucket: tuple[list[np.ndarray], np.ndarray], k: int, scale: float) -> _Bucket:
        views, buf = bucket
        n, wire = int(buf.size), buf.dtype
        key = (n, wire.itemsize)
        share = self._shares.get(key)
        if share is None:
            bounds = share_bounds(n, self.size, wire.itemsize)
            share = self._shares[key] = (bounds[self.rank], bounds[self.rank + 1])
        placement = place_scale(scale, wire, self.size)
        return _Bucket(views, self._typed_slots(k & 1, wire)[:, :n], share, placement, k, scale)

    def _publish(self, b: _Bucket) -> None:
        """This rank's bucket, cast (and times the scale when it goes before the sum) into its
        input slot; announced. A bucket that is one piece of the wire dtype publishes only the
        other ranks' shares: this rank sums its own share straight from the piece."""
        mine = b.slots[self.rank]
        if b.direct is not None:
            lo, hi = b.share
            np.copyto(mine[:lo], b.direct[:lo])
            np.copyto(mine[hi:], b.direct[hi:])
        else:
            kernels.pack(b.views, mine, b.placement.before)
        self._raise(_PUBLISHED, b.k + 1)

    def _reduce_share(self, b: _Bucket) -> None:
        """This rank's share of the bucket: every rank's contribution summed in rank order
        (:func:`sum_in_rank_order`, as the single-copy path does, so both give the same bits;
        each share is summed by one rank only, so every rank gets the same bits), then times
        the scale where the reduction averages, written to the result slot."""
        lo, hi = b.share
        if lo == hi:
            return
        parts = [b.slots[q, lo:hi] for q in range(self.size)]
        result = b.slots[self.size, lo:hi]
        out = result
        if b.direct is not None:
            # summed into the piece itself, which holds this rank's values
            out = parts[self.rank] = b.direct[lo:hi]
        if self.size == 1:
            np.copyto(out, parts[0])
        else:
            sum_in_rank_order(parts, out, spare=result)
        if b.placement.average:
            work = kernels.scale_dtype(out.dtype, out.dtype)
            np.multiply(out, work.type(b.scale), out=out, dtype=work, casting="unsafe")
        if b.direct is not None:
            np.copyto(result, out)

    def _copy_out(self, b: _Bucket) -> None:
        result = b.slots[self.size]
        if b.direct is not None:  # this rank's own share is already in place
            lo, hi = b.share
            np.copyto(b.direct[:lo], result[:lo])
            np.copyto(b.direct[hi:], result[hi:])
        else:
            kernels.unpack(result, b.views)

    # -- counters ----------------------------------------------------------------------------------

    def _raise(self, kind: int, value: int) -> None:
        """Announce that this rank has done step ``kind`` (0 published, 1 reduced) of bucket
        ``value - 1``: one aligned 8-byte store, after the data it announces."""
        self._counters[(kind * self.size + self.rank) * self._stride] = value

    def _wait(
        self,
        kind: int,
        value: int,
        barrier: Callable[[], None],
        deadline: Deadline | None,
        started: float,
    ) -> None:
        """Return once every rank's counter ``kind`` has reached ``value``."""
        if not self.ordered_stores:
            barrier()
            return
        counters, stride, base = self._counters, self._stride, kind * self.size
        for q in range(self.size):
            index = (base + q) * stride
            if counters[index] >= value:
                continue
            for _ in range(_SPINS):
                if counters[index] >= value:
                    break
            else:
                self._wait_long(index, value, deadline, started)

    def _wait_long(self, index: int, value: int, deadline: Deadline | None, started: float) -> None:
        """A rank is late: give the CPU away (it may be the core that rank needs), first by
        yielding, then by sleeping; past the watchdog's deadline, raise its error."""
        counters = self._counters
        observers.wait_begins()  # for mnify run: this rank waits on the others, as in MPI
        try:
            yield_until = time.monotonic() + _YIELD_FOR
            while counters[index] < value:
                _yield_cpu()
                if time.monotonic() > yield_until:
                    break
            pause = _FIRST_SLEEP
            limit = None if deadline is None else started + deadline.timeout
            while counters[index] < value:
                if limit is not None and time.monotonic() > limit:
                    raise deadline.timeout_error()  # type: ignore[union-attr]
                time.sleep(pause)
                pause = min(pause * 2, _MAX_SLEEP)
        finally:
            observers.wait_ends()

    # -- the hierarchical communicator's stages ----------------------------------------------------

    def mean_through_leader(
        self,
        views: Sequence[np.ndarray],
        buf: np.ndarray,
        scale: float,
        barrier: Callable[[], None],
        across_hosts: Callable[[np.ndarray], None] | None,
    ) -> None:
        """One bucket's mean for the hierarchical communicator: every rank publishes its scaled
        bucket, rank 0 of this host sums the slots into the result slot and, with
        ``across_hosts``, all-reduces it in place with the other hosts' leaders; after a second
        barrier every rank reads the result."""
        parity = self._parity
        self._parity ^= 1
        typed = self._typed_slots(parity, buf.dtype)[:, : buf.size]
        kernels.pack(views, typed[self.rank], scale)
        barrier()
        result = typed[self.size]
        if self.rank == 0:
            self._sum(typed[: self.size], result)
            if across_hosts is not None:
                across_hosts(result)
        barrier()
        kernels.unpack(result, views)

    def _sum(self, slots: np.ndarray, out: np.ndarray) -> None:
        if self.size == 1:
            np.copyto(out, slots[0])
            return
        sum_in_rank_order(list(slots), out)

    def close(self) -> None:
        self._counters.release()
        self._slots = np.empty((2, 0, 0), dtype=np.uint8)  # drop the views into the mapping
        self._typed.clear()
        try:
            self._segment.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass


def _bucket_nbytes(bucket: tuple[list[np.ndarray], np.ndarray]) -> int:
    """A bucket's size: its buffer's bytes."""
    return int(bucket[1].nbytes)
