"""The whole dataset on every rank, held once per host when it is made of numpy arrays.

The global-batch iterator (docs/global_batch.md) needs every example on every rank. Broadcasting
the dataset's pickle (``comm.bcast_obj``) gives each rank its own copy: on a host of 8 ranks, 8
copies. :func:`bcast_dataset` keeps one per host for a ``TupleDataset`` of numpy arrays (or one
array): rank 0's arrays go, over MPI, to one rank per host, which receives them straight into a
shared-memory file (``/dev/shm``); the other ranks of the host map that file. The file is
unlinked once every rank of the host mapped it, so nothing is left behind, whatever happens to
the job later; the memory lives as long as a rank holds the arrays. The arrays are read-only.

Any other dataset (a list, a user's class, arrays in another library), a host whose ``/dev/shm``
cannot hold the arrays (checked by reserving the space first, so a full tmpfs is a fallback, not a
crash), or a single rank: the pickle broadcast, a copy per rank, as before.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import uuid
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

ALIGN = 64  # every array starts on a cache line (and any dtype's alignment)
PIECE_BYTES = 256 << 20  # one MPI Bcast moves at most this much


def _columns(dataset: Any) -> tuple[str, list[np.ndarray]] | None:
    """("tuple", arrays) for a TupleDataset of numpy arrays, ("array", [a]) for one array."""
    if isinstance(dataset, np.ndarray):
        return "array", [dataset]
    if isinstance(dataset, chainer.datasets.TupleDataset):
        columns = list(getattr(dataset, "_datasets", ()))
        if columns and all(isinstance(c, np.ndarray) for c in columns):
            return "tuple", columns
    return None


def _offsets(layout: list[tuple[tuple[int, ...], str]]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for shape, dtype in layout:
        offsets.append(end)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        end += -(-nbytes // ALIGN) * ALIGN
    return offsets, end


def _segment_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _views(buffer: Any, layout: list[tuple[tuple[int, ...], str]]) -> list[np.ndarray]:
    offsets, _ = _offsets(layout)
    views = []
    for (shape, dtype), offset in zip(layout, offsets, strict=True):
        count = int(np.prod(shape, dtype=np.int64))
        views.append(np.frombuffer(buffer, np.dtype(dtype), count, offset).reshape(shape))
    return views


def bcast_dataset(dataset: Any, comm: CommunicatorBase) -> Any:
    """Rank 0's ``dataset`` on every rank (collective; the other ranks' argument is ignored).

    A ``TupleDataset`` of numpy arrays, or one numpy array, comes back as the same kind of
    dataset over read-only arrays that all ranks of a host share (one copy per host); anything
    else comes back as ``comm.bcast_obj(dataset)`` would give it.
    """
    if comm.size == 1:
        return dataset
    plan = None
    if comm.rank == 0:
        found = _columns(dataset)
        if found is not None:
            kind, columns = found
            layout = [(tuple(int(d) for d in c.shape), c.dtype.str) for c in columns]
            if _offsets(layout)[1] > 0 and all(c.dtype.kind in "biufc" for c in columns):
                plan = (kind, layout, f"mnify-dataset-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    plan = comm.bcast_obj(plan)
    if plan is None:
        return comm.bcast_obj(dataset)
    kind, layout, name = plan
    shared = _share_per_host(dataset if comm.rank == 0 else None, comm, layout, name)
    if shared is None:  # some host could not hold it: a copy per rank
        return comm.bcast_obj(dataset)
    return shared[0] if kind == "array" else chainer.datasets.TupleDataset(*shared)


def _share_per_host(
    dataset: Any, comm: CommunicatorBase, layout: list[tuple[tuple[int, ...], str]], name: str
) -> list[np.ndarray] | None:
    """The arrays in one shared file per host; None (on every rank) if a host had no room."""
    from mpi4py import MPI  # here, not at import: MPI must not start before a forkserver does

    world = comm.mpi_comm
    leader = comm.intra_rank == 0
    host = world.Split(comm.inter_rank, comm.intra_rank)
    leaders = world.Split(0 if leader else MPI.UNDEFINED, comm.rank)
    path = os.path.join(_segment_dir(), f"{name}-h{comm.inter_rank}")
    _, total = _offsets(layout)
    segment: mmap.mmap | None = None
    try:
        ok, created = True, False
        if leader:
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                created = True
                try:
                    os.posix_fallocate(fd, 0, total)  # ENOSPC now rather than SIGBUS later
                    segment = mmap.mmap(fd, total)
                finally:
                    os.close(fd)
            except OSError:
                ok = False
        ok = bool(world.allreduce(ok, op=MPI.LAND))  # every rank learns whether to fall back
        if not ok:
            if segment is not None:
                segment.close()
            if created:
                os.unlink(path)
            return None
        if leader:
            assert segment is not None
            views = _views(segment, layout)
            if comm.rank == 0:
                for view, column in zip(views, _columns(dataset)[1], strict=True):  # type: ignore[index]
                    view[...] = column
            flat = np.frombuffer(segment, np.uint8, total)
            for start in range(0, total, PIECE_BYTES):
                leaders.Bcast(flat[start : start + PIECE_BYTES], root=0)
            del flat
            for view in views:
                view.flags.writeable = False
        host.Barrier()  # the host's file is complete
        if not leader:
            fd = os.open(path, os.O_RDONLY)
            try:
                segment = mmap.mmap(fd, total, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            views = _views(segment, layout)
        host.Barrier()  # every rank of the host mapped it
        if leader:
            os.unlink(path)
        return views
    finally:
        host.Free()
        if leaders != MPI.COMM_NULL:
            leaders.Free()
