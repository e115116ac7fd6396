"""Averaging gradients in place across the ranks of one host, reading and writing each other's
memory directly (Linux cross-memory attach: ``process_vm_readv`` / ``process_vm_writev``).

The shared-memory segment (:mod:`~mnify.runtime.communicators.shared_memory`) stages every
bucket: a rank copies it in, the owner of each share sums the copies, and every rank copies the
result out. Memory traffic, not arithmetic, bounds a mean on one host, and each of those copies
is a pass over the gradients. Here nothing is staged. Rank r owns a 1/size share of the
gradients (all arrays seen as one vector, shares cut on cache lines) and, one cache-sized chunk
at a time:

1. reads the chunk from every other rank's own gradient arrays straight into a small buffer
   (one ``process_vm_readv`` per rank, the chunk's pieces as one I/O vector), and sums it into
   its own gradients in rank order (``x0 + x1 + x2 ...``, whichever rank owns the share);
2. multiplies the chunk by the scale while it is still in cache;
3. writes the finished chunk into every other rank's gradients (``process_vm_writev``).

Per rank that is one read of the others' share, one read and one write of its own share and
one write into the others: two passes over the gradients, what a bare MPI all-reduce of the
same bytes costs, with the 1/size inside. Each element is summed by one rank only, so every
rank ends with the same bits, and the sum order is the shared-memory path's.

Only two collectives frame a mean: an all-gather of the arrays' addresses (which also says that
every rank's gradients are final) and a barrier after which every rank's gradients hold the
mean. In between, rank r reads only the regions of share r in other ranks, which only rank r
writes, after reading them; nothing else touches them.

Cross-memory attach needs the ranks to run as one user and the kernel (or a container's
seccomp profile, or Yama's ``ptrace_scope``) to allow it; creation probes it on every rank and
the communicator keeps the segment path where it is refused. Where both work, the communicator
times both on the first calls and keeps the faster (they give the same bits);
``MNIFY_SINGLE_COPY=1`` always takes this path, ``0`` never.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from mnify import environment
from mnify.runtime import kernels, observers
from mnify.runtime.communicators.shared_memory import share_bounds

# Chunk of a rank's share reduced at a time: small enough that the chunk stays in cache
# between the sum, the scale and the writes to the other ranks. Measured in bench/allreduce.py.
CHUNK_BYTES = 1 << 20
# Linux accepts at most this many pieces per I/O vector (UIO_MAXIOV).
_IOV_MAX = 1024
# Plans (and measured choices, in mean_grad) kept for this many array lists at most.
PLANS_KEPT = 8


def enabled_by_env() -> bool:
    """``MNIFY_SINGLE_COPY`` is not 0: the path may be taken (always when 1; when unset or auto
    the communicator times both and keeps the faster, :mod:`.path_choice`)."""
    return environment.SINGLE_COPY.read() is not False


def forced_by_env() -> bool:
    """``MNIFY_SINGLE_COPY=1``: always this path, nothing measured."""
    return environment.SINGLE_COPY.read() is True


def _syscalls() -> tuple[Any, Any] | None:
    """libc's process_vm_readv and process_vm_writev, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        calls = libc.process_vm_readv, libc.process_vm_writev
    except (OSError, AttributeError):
        return None
    for call in calls:
        # pid, local iovec*, count, remote iovec*, count, flags
        call.argtypes = [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_ulong,
            ctypes.c_void_p,
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
        call.restype = ctypes.c_ssize_t
    return calls


class _Plan:
    """How this rank walks its share for one list of array sizes: the share's pieces (array,
    byte offset, bytes), cut into chunks of at most ``CHUNK_BYTES`` and ``_IOV_MAX`` pieces."""

    def __init__(self, sizes: tuple[int, ...], itemsize: int, rank: int, size: int) -> None:
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        total = int(starts[-1])
        bounds = share_bounds(total, size, itemsize)
        lo, hi = bounds[rank], bounds[rank + 1]
        index: list[int] = []
        first: list[int] = []  # element offsets inside each array
        count: list[int] = []
        chunk_ends: list[int] = []  # piece index where each chunk ends
        per_chunk = max(1, CHUNK_BYTES // itemsize)
        at = lo
        i = int(np.searchsorted(starts, lo, side="right")) - 1 if lo < total else len(sizes)
        room, pieces_in_chunk = per_chunk, 0
        while at < hi:
            end = min(hi, int(starts[i + 1]), at + room)
            if end > at:
                index.append(i)
                first.append(at - int(starts[i]))
                count.append(end - at)
                room -= end - at
                pieces_in_chunk += 1
            at = end
            if at == int(starts[i + 1]):
                i += 1
            if room == 0 or pieces_in_chunk == _IOV_MAX:
                chunk_ends.append(len(index))
                room, pieces_in_chunk = per_chunk, 0
        if not chunk_ends or chunk_ends[-1] != len(index):
            chunk_ends.append(len(index))
        self.index = np.array(index, dtype=np.int64)
        self.first = first
        self.count = count
        self.byte_offset = np.array(first, dtype=np.uint64) * np.uint64(itemsize)
        self.byte_count = np.array(count, dtype=np.uint64) * np.uint64(itemsize)
        self.chunks = [
            (a, b) for a, b in zip([0, *chunk_ends[:-1]], chunk_ends, strict=True) if b > a
        ]
        self.largest_chunk = max((sum(count[a:b]) for a, b in self.chunks), default=0)


class SingleCopyReducer:
    """In-place means of gradient lists across the ranks of ``comm``, all on one host."""

    def __init__(self, comm: MPI.Intracomm, pids: list[int], calls: tuple[Any, Any]) -> None:
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._pids = pids
        self._readv, self._writev = calls
        self._plans: dict[tuple[str, tuple[int, ...]], _Plan] = {}
        self._scratch = np.empty(0, dtype=np.uint8)

    @classmethod
    def create(cls, comm: MPI.Intracomm) -> SingleCopyReducer | None:
        """Collective. None unless every rank can read and write every other rank's memory.

        Probed pairwise: each rank reads every other rank's cookie (this job's random token
        plus the rank, so a process id that names some other process cannot pass) and writes
        its own into that rank's landing slot; one refusal anywhere keeps every rank on the
        segment."""
        calls = _syscalls()
        rank, size = comm.Get_rank(), comm.Get_size()
        token = comm.bcast(int.from_bytes(os.urandom(6), "little") << 8, root=0)
        cookie = np.array([token + rank], dtype=np.int64)
        landing = np.zeros(size, dtype=np.int64)
        table = comm.allgather(
            (os.getpid(), cookie.ctypes.data, landing.ctypes.data, calls is not None)
        )
        ok = calls is not None and all(entry[3] for entry in table)
        if ok and calls is not None:
            got = np.zeros(1, dtype=np.int64)
            for q, (pid, their_cookie, their_landing, _) in enumerate(table):
                if q == rank:
                    continue
                slot = their_landing + 8 * rank
                ok = (
                    _transfer(calls[0], pid, [(got.ctypes.data, 8)], [(their_cookie, 8)]) == 8
                    and int(got[0]) == token + q
                    and _transfer(calls[1], pid, [(cookie.ctypes.data, 8)], [(slot, 8)]) == 8
                )
                if not ok:
                    break
        comm.Barrier()  # every write has landed
        ok = ok and all(int(landing[q]) == token + q for q in range(size) if q != rank)
        if not comm.allreduce(ok, op=MPI.LAND) or calls is None:
            return None
        return cls(comm, [entry[0] for entry in table], calls)

    def mean(
        self,
        flats: list[np.ndarray],
        sizes: tuple[int, ...],
        scale: float,
        exchange: Callable[[np.ndarray, np.ndarray], None],
        barrier: Callable[[], None],
    ) -> None:
        """Replace every array of ``flats`` (1-D, contiguous, one dtype, the same sizes on
        every rank; ``sizes``: theirs) by its sum over ranks times ``scale``, in place.
        ``exchange(mine, all)`` all-gathers this rank's array addresses; ``barrier``
        synchronises the ranks (both through the communicator, so the watchdog times them)."""
        dtype = flats[0].dtype
        key = (dtype.str, sizes)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= PLANS_KEPT:  # stray array lists: do not grow without end
                self._plans.clear()
            plan = self._plans[key] = _Plan(sizes, dtype.itemsize, self.rank, self.size)
        mine = np.array([f.ctypes.data for f in flats], dtype=np.uint64)
        every = np.empty((self.size, len(flats)), dtype=np.uint64)
        exchange(mine, every)  # also: every rank's gradients are final
        if plan.chunks:
            self._reduce_share(flats, plan, every, scale)
        barrier()  # every rank has written its share into every other

    def _reduce_share(
        self, flats: list[np.ndarray], plan: _Plan, every: np.ndarray, scale: float
    ) -> None:
        dtype = flats[0].dtype
        need = plan.largest_chunk * dtype.itemsize
        if self._scratch.nbytes < 2 * need:
            self._scratch = np.empty(2 * need, dtype=np.uint8)
        halves = self._scratch[: 2 * need].view(dtype)
        scratch = (halves[: plan.largest_chunk], halves[plan.largest_chunk :])
        peers = [q for q in range(self.size) if q != self.rank]
        # I/O vectors ([address, bytes] rows) of the share's pieces, here and in each peer
        local = np.empty((len(plan.index), 2), dtype=np.uint64)
        local[:, 0] = every[self.rank][plan.index] + plan.byte_offset
        local[:, 1] = plan.byte_count
        remote = {}
        for q in peers:
            rows = np.empty_like(local)
            rows[:, 0] = every[q][plan.index] + plan.byte_offset
            rows[:, 1] = plan.byte_count
            remote[q] = rows
        # scaled in float32, or float64 for float64 arrays, as the segment path does
        factor = kernels.scale_dtype(dtype, dtype).type(scale)
        pieces = zip(plan.index.tolist(), plan.first, plan.count, strict=True)
        views = [flats[i][a : a + n] for i, a, n in pieces]
        for a, b in plan.chunks:
            nbytes = int(plan.byte_count[a:b].sum())
            with observers.bucket(nbytes):
                self._chunk(nbytes, views[a:b], (a, b), local, remote, scratch, factor)

    def _chunk(
        self,
        nbytes: int,
        chunk: list[np.ndarray],
        rows: tuple[int, int],
        local: np.ndarray,
        remote: dict[int, np.ndarray],
        scratch: tuple[np.ndarray, np.ndarray],
        factor: np.floating[Any],
    ) -> None:
        """One chunk of this rank's share (``nbytes``, the pieces ``chunk``; rows ``rows`` of the
        I/O vectors): summed over ranks, scaled, written into every other rank. Published as one
        bucket (:mod:`mnify.runtime.observers`)."""
        a, b = rows
        self._sum_chunk(chunk, nbytes, remote, rows, scratch)
        if factor != 1:
            for v in chunk:
                np.multiply(v, factor, out=v, dtype=factor.dtype, casting="unsafe")
        for q in remote:
            self._call(self._writev, q, local[a:b], remote[q][a:b], nbytes)

    def _sum_chunk(
        self,
        chunk: list[np.ndarray],
        nbytes: int,
        remote: dict[int, np.ndarray],
        rows: tuple[int, int],
        scratch: tuple[np.ndarray, np.ndarray],
    ) -> None:
        """The chunk's pieces (this rank's values) become the sum over ranks in rank order,
        the shared-memory path's order (:func:`~mnify.runtime.communicators.shared_memory.
        sum_in_rank_order`): the ranks before this one are summed in ``scratch[0]`` first
        unless they are one rank (then ``x0 + xr == xr + x0`` exactly), each other rank's
        values read into ``scratch[1]``."""
        a, b = rows
        sizes = [int(v.size) for v in chunk]
        n = sum(sizes)
        prefix, incoming = scratch[0][:n], scratch[1][:n]

        def read(q: int, into: np.ndarray) -> np.ndarray:
            target = np.array([[into.ctypes.data, nbytes]], dtype=np.uint64)
            self._call(self._readv, q, target, remote[q][a:b], nbytes)
            return into

        def add_into_pieces(values: np.ndarray) -> None:  # values + v == v + values, bit for bit
            at = 0
            for v, k in zip(chunk, sizes, strict=True):
                np.add(values[at : at + k], v, out=v)
                at += k

        r = self.rank
        if r >= 2:
            read(0, prefix)
            for q in range(1, r):
                np.add(prefix, read(q, incoming), out=prefix)
            add_into_pieces(prefix)
        elif r == 1:
            add_into_pieces(read(0, incoming))
        for q in range(r + 1, self.size):
            add_into_pieces(read(q, incoming))

    def _call(
        self, call: Any, peer: int, local: np.ndarray, remote: np.ndarray, nbytes: int
    ) -> None:
        moved = call(
            self._pids[peer], local.ctypes.data, len(local), remote.ctypes.data, len(remote), 0
        )
        if moved != nbytes:
            errno = ctypes.get_errno()
            raise RuntimeError(
                f"cross-memory transfer with rank {peer} moved {moved} of {nbytes} bytes "
                f"({os.strerror(errno) if moved < 0 else 'short'}): its gradients changed or "
                "went away during the mean"
            )


def _transfer(
    call: Any, pid: int, local: list[tuple[int, int]], remote: list[tuple[int, int]]
) -> int:
    """One process_vm_readv/writev over (address, bytes) pieces; the bytes moved, -1 on error."""
    lv = np.array(local, dtype=np.uint64).reshape(-1, 2)
    rv = np.array(remote, dtype=np.uint64).reshape(-1, 2)
    return int(call(pid, lv.ctypes.data, len(lv), rv.ctypes.data, len(rv), 0))
