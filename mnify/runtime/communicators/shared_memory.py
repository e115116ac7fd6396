"""Averaging buckets through a shared-memory segment when every rank runs on one host.

An MPI Allreduce followed by the 1/size pass goes over the gradients in memory twice; on one
host the mean needs one such pass plus work on cache-sized slots. Each rank writes its bucket,
cast and scaled, into its own slot of a segment all ranks map; after one barrier every rank
sums the slots, in rank order, straight into its gradients. Slots are double-buffered: bucket k
uses parity k % 2, so the barrier of bucket k + 1 already proves that every rank has finished
reading bucket k's slots before anyone overwrites them, and one barrier per bucket suffices.
The hierarchical communicator uses the same segment per host with a result slot: the host's
leader sums into it and all-reduces it with the other leaders; a second barrier releases the
readers (:meth:`SharedMemoryReducer.mean_through_leader`).

Every rank adds the slots in the same order, so all ranks get bit-identical results. The segment
is a file under ``/dev/shm`` (or the temporary directory), created by rank 0 with its space
reserved up front (``posix_fallocate``: a full tmpfs fails here instead of crashing later with
SIGBUS), mapped by every rank and unlinked at once, so nothing outlives the job.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from mnify.runtime import kernels

ENV = "MNIFY_SHARED_MEMORY"  # "0" turns this path off (MPI Allreduce instead)


def enabled_by_env() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


SEGMENT_BUDGET = 32 << 20
# Slots small enough that a bucket stays in cache between packing and summing. Measured with
# bench/allreduce.py on 2 ranks (ResNet-50 gradients), two quiet runs, ms:
#   slot        64 KiB  128 KiB  256 KiB  512 KiB  1 MiB  4 MiB
#   run 1        34.4    27.4     25.4     25.8    29.1   35.0   (MPI Allreduce + 1/size: 27.3)
#   run 2        38.3    30.3     29.5     30.0    33.1     -    (MPI Allreduce + 1/size: 30.4)
SLOT_CAP = 256 << 10


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


class SharedMemoryReducer:
    """Bucket means across the ranks of ``comm``, all of which share one host's memory."""

    def __init__(self, segment: mmap.mmap, rank: int, size: int, slot_bytes: int) -> None:
        self._segment = segment
        self.rank = rank
        self.size = size
        self.slot_bytes = slot_bytes
        raw = np.frombuffer(segment, dtype=np.uint8)
        # per parity: one slot per rank, then the leader's result slot
        self._slots = raw.reshape(2, size + 1, slot_bytes)
        self._typed: dict[tuple[int, str], np.ndarray] = {}  # (parity, dtype) -> typed slots
        self._parity = 0

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
        nbytes = 2 * (size + 1) * slot_bytes
        path = None
        if rank == 0:
            path = os.path.join(_segment_dir(), f"mnify-{os.getpid()}-{uuid.uuid4().hex[:12]}")
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.posix_fallocate(fd, 0, nbytes)
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

    def mean(
        self,
        views: Sequence[np.ndarray],
        buf: np.ndarray,
        scale: float,
        barrier: Callable[[], None],
    ) -> None:
        """Replace the pieces ``views`` (1-D) by their sum over ranks times ``scale``.

        ``buf`` is a staging buffer of the wire dtype holding at least the pieces' total size
        (which must fit a slot); a bucket that is one piece of the wire dtype never touches it.
        """
        slots = self._publish(views, buf.dtype, scale)
        barrier()
        n = slots.shape[1]
        out = views[0] if len(views) == 1 and views[0].dtype == buf.dtype else buf[:n]
        self._sum(slots[: self.size], out)
        if out is not views[0]:
            kernels.unpack(out, views)

    def mean_through_leader(
        self,
        views: Sequence[np.ndarray],
        buf: np.ndarray,
        scale: float,
        barrier: Callable[[], None],
        across_hosts: Callable[[np.ndarray], None] | None,
    ) -> None:
        """:meth:`mean` for the hierarchical communicator: rank 0 of this host sums the slots
        into the result slot and, with ``across_hosts``, all-reduces it in place with the other
        hosts' leaders; after a second barrier every rank reads the result."""
        slots = self._publish(views, buf.dtype, scale)
        barrier()
        result = slots[self.size]
        if self.rank == 0:
            self._sum(slots[: self.size], result)
            if across_hosts is not None:
                across_hosts(result)
        barrier()
        kernels.unpack(result, views)

    def _publish(
        self, views: Sequence[np.ndarray], wire: np.dtype[Any], scale: float
    ) -> np.ndarray:
        """Pack ``views`` times ``scale`` into this rank's slot of the next parity; returns that
        parity's slots (every rank's, then the result slot) as ``wire`` arrays."""
        parity = self._parity
        self._parity ^= 1
        key = (parity, wire.str)
        typed = self._typed.get(key)
        if typed is None:
            usable = self.slot_bytes // wire.itemsize * wire.itemsize
            typed = self._slots[parity, :, :usable].view(wire)
            self._typed[key] = typed
        if len(views) == 1 and views[0].dtype == wire:
            # the common case (a slice of one large array): skip the general packing
            piece = views[0]
            slots = typed[:, : piece.size]
            if scale == 1.0:
                np.copyto(slots[self.rank], piece)
            else:
                work = kernels.scale_dtype(wire, wire)  # float16 scales in float32, as pack does
                np.multiply(
                    piece, work.type(scale), out=slots[self.rank], dtype=work, casting="unsafe"
                )
            return slots
        slots = typed[:, : sum(int(v.size) for v in views)]
        kernels.pack(views, slots[self.rank], scale)
        return slots

    def _sum(self, slots: np.ndarray, out: np.ndarray) -> None:
        if self.size == 1:
            np.copyto(out, slots[0])
            return
        np.add(slots[0], slots[1], out=out)
        for q in range(2, self.size):
            np.add(out, slots[q], out=out)

    def close(self) -> None:
        self._slots = np.empty((2, 0, 0), dtype=np.uint8)  # drop the views into the mapping
        self._typed.clear()
        try:
            self._segment.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass
