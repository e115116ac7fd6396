"""The communicator contract on MPI: topology, array and object collectives, gradient averaging.

Every public collective goes through :meth:`CommunicatorBase._enter` (counts it, starts the
watchdog's deadline, runs the ``MNIFY_DEBUG`` signature check) and every MPI call through
:meth:`CommunicatorBase._mpi` (blocking MPI when the watchdog is off; the non-blocking twin polled
against the deadline when it is on).

Data travels as numpy on the host; CuPy arrays are staged through host memory. Arrays whose
shapes may differ per rank (gather, allgather, alltoall, scatter, send/recv) travel as raw bytes
after a small pickled header (dtype, shape) -- never pickled themselves -- so float16 travels too.
Reductions run in the array's dtype when this MPI can reduce it, else in float32 (float16 on MPI
libraries without ``MPI_SHORT_FLOAT`` sums).

Subclasses choose how gradients are averaged (:meth:`_reduce_arrays`) and how one buffer is
all-reduced (:meth:`_allreduce_into`).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, cast

import numpy as np
from mpi4py import MPI

from mnify.runtime import debug, kernels, rank_state, timeline
from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators import shared_memory
from mnify.runtime.communicators.buckets import PlanCache
from mnify.runtime.communicators.parameters import grads_to_reduce, named_params
from mnify.runtime.communicators.shared_memory import SharedMemoryReducer
from mnify.runtime.communicators.topology import Topology
from mnify.runtime.communicators.wire import as_bytes, from_bytes, header_of, offsets
from mnify.runtime.debug import CallSignature
from mnify.runtime.errors import CollectiveMismatch
from mnify.runtime.watchdog import Watchdog, timeout_from_env

# Buckets for reductions over MPI. bench/allreduce.py, 2 ranks, Open MPI 5 shared memory,
# ResNet-50's 97.5 MiB of gradients, best of 21: raw Allreduce in 256 KiB..16 MiB pieces all
# within 15% of the best (1 MiB, 18.4 ms), the whole buffer at once 1.9x; flat over MPI with
# 1/2/4/8 MiB buckets 37.9/37.3/35.8/34.8 ms. On a loaded machine larger pieces suffer less
# from every rank having to be scheduled at each collective, hence 4 MiB rather than 1.
DEFAULT_BUCKET_BYTES = 4 << 20

# Over MPI, arrays from this size up are reduced in their own memory (one Allreduce per
# bucket-sized piece) instead of being packed with others.
OWN_BUCKET_BYTES = 64 << 10

_ARRAY = "array"
_OBJECT = "object"


class CommunicatorBase:
    """A communicator over a duplicate of ``mpi_comm`` (default ``COMM_WORLD``).

    Collective: every rank of ``mpi_comm`` must construct it, with the same arguments.
    """

    name: ClassVar[str] = "base"
    # average gradient buckets through a shared segment when all ranks share one host
    uses_shared_memory: ClassVar[bool] = False

    def __init__(
        self,
        mpi_comm: MPI.Intracomm | None = None,
        *,
        allreduce_grad_dtype: Any = None,
        bucket_bytes: int | None = None,
    ) -> None:
        parent = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.mpi_comm: MPI.Intracomm = parent.Dup()
        self.topology = Topology.of(self.mpi_comm)
        self.allreduce_grad_dtype: np.dtype[Any] | None = (
            None if allreduce_grad_dtype is None else np.dtype(allreduce_grad_dtype)
        )
        self.bucket_bytes = int(bucket_bytes) if bucket_bytes else DEFAULT_BUCKET_BYTES
        if self.bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self._seq = 0
        self._debug = debug.enabled()
        timeout = timeout_from_env()
        self._watchdog = Watchdog(self.mpi_comm, timeout) if timeout else None
        self._plans = PlanCache()
        self._finalized = False
        self._batched_copy = True
        self._config_depth = 0
        self._make_comms()
        # made now, while construction is a blocking collective anyway (the watchdog times
        # collectives, not set-up); None when not wanted (MNIFY_SHARED_MEMORY=0) or possible
        self._shm: SharedMemoryReducer | None = None
        if self.uses_shared_memory and shared_memory.enabled_by_env():
            self._shm = self._create_shared_memory()
        # MNIFY_TIMELINE: when every rank records, this instance's collectives are wrapped
        timeline.attach(self)

    # -- topology -------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def intra_rank(self) -> int:
        return self.topology.intra_rank

    @property
    def intra_size(self) -> int:
        return self.topology.intra_size

    @property
    def inter_rank(self) -> int:
        return self.topology.inter_rank

    @property
    def inter_size(self) -> int:
        return self.topology.inter_size

    @property
    def host_name(self) -> str:
        return self.topology.host_name

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} rank {self.rank}/{self.size} "
            f"host {self.host_name!r} intra {self.intra_rank}/{self.intra_size} "
            f"inter {self.inter_rank}/{self.inter_size}>"
        )

    # -- plumbing: every collective enters here, every MPI call runs through _mpi ------------------

    def _enter(self, signature: CallSignature, *, timed: bool = True) -> None:
        """Count the collective, start its watchdog deadline (none if not ``timed``), check
        signatures in debug mode."""
        if self._finalized:
            raise RuntimeError(f"{signature.kind} on a finalized communicator")
        self._seq += 1
        rank_state.entered(signature.kind, self._seq)
        if self._watchdog is not None:
            self._watchdog.start(signature.kind, self._seq, timed=timed)
        if self._debug:
            debug.check(signature, self._allgather_signatures)

    def _enter_p2p(self, kind: str, peer: int) -> None:
        """Point to point: not a collective, so neither counted nor signature-checked; the
        watchdog still bounds the wait and blames ``peer``."""
        if self._finalized:
            raise RuntimeError(f"{kind} on a finalized communicator")
        rank_state.entered(kind, self._seq)
        if self._watchdog is not None:
            self._watchdog.start(kind, self._seq, peer=peer)

    def _allgather_signatures(self, signature: CallSignature) -> list[CallSignature]:
        return [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(signature))]

    def _mpi(self, comm: MPI.Comm, method: str, *args: Any, **kwargs: Any) -> None:
        """``comm.<method>(...)``, or its non-blocking twin ``I<method>`` under the watchdog."""
        rank_state.wait_begins()
        try:
            if self._watchdog is None:
                getattr(comm, method)(*args, **kwargs)
            else:
                self._watchdog.wait(getattr(comm, "I" + method.lower())(*args, **kwargs))
        finally:
            rank_state.wait_ends()

    def _wait_all(self, requests: list[MPI.Request]) -> None:
        rank_state.wait_begins()
        try:
            if self._watchdog is None:
                MPI.Request.Waitall(requests)
            else:
                self._watchdog.waitall(requests)
        finally:
            rank_state.wait_ends()

    # -- byte-level collectives (no _enter: parts of a public collective) --------------------------

    def _allgather_bytes(self, payload: bytes | np.ndarray) -> list[bytes]:
        raw, counts, displs = self._allgather_raw(np.frombuffer(payload, dtype=np.uint8))
        return [raw[d : d + n].tobytes() for d, n in zip(displs, counts, strict=True)]

    def _allgather_raw(self, mine: np.ndarray) -> tuple[np.ndarray, list[int], list[int]]:
        sizes = np.empty(self.size, dtype=np.int64)
        self._mpi(self.mpi_comm, "Allgather", np.array([mine.size], dtype=np.int64), sizes)
        counts = [int(c) for c in sizes]
        displs = offsets(counts)
        raw = np.empty(sum(counts), dtype=np.uint8)
        self._mpi(self.mpi_comm, "Allgatherv", [mine, MPI.BYTE], [raw, (counts, displs), MPI.BYTE])
        return raw, counts, displs

    def _gather_raw(
        self, mine: np.ndarray, root: int
    ) -> tuple[np.ndarray, list[int], list[int]] | None:
        sizes = np.empty(self.size, dtype=np.int64) if self.rank == root else None
        self._mpi(self.mpi_comm, "Gather", np.array([mine.size], dtype=np.int64), sizes, root=root)
        if sizes is None:
            self._mpi(self.mpi_comm, "Gatherv", [mine, MPI.BYTE], None, root=root)
            return None
        counts = [int(c) for c in sizes]
        displs = offsets(counts)
        raw = np.empty(sum(counts), dtype=np.uint8)
        self._mpi(
            self.mpi_comm, "Gatherv", [mine, MPI.BYTE], [raw, (counts, displs), MPI.BYTE], root=root
        )
        return raw, counts, displs

    def _bcast_bytes(self, payload: bytes | None, root: int) -> bytes:
        size = np.array([len(payload) if payload is not None else 0], dtype=np.int64)
        self._mpi(self.mpi_comm, "Bcast", size, root=root)
        if self.rank == root:
            assert payload is not None
            raw = np.frombuffer(payload, dtype=np.uint8).copy()
        else:
            raw = np.empty(int(size[0]), dtype=np.uint8)
        self._mpi(self.mpi_comm, "Bcast", [raw, MPI.BYTE], root=root)
        return raw.tobytes()

    def _scatter_raw(self, parts: Sequence[np.ndarray] | None, root: int) -> np.ndarray:
        """Root's ``parts[r]`` (1-D uint8) arrive at rank r."""
        size = np.empty(1, dtype=np.int64)
        if self.rank == root:
            assert parts is not None
            counts = [int(p.size) for p in parts]
            self._mpi(self.mpi_comm, "Scatter", np.array(counts, dtype=np.int64), size, root=root)
            send = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)
            spec: Any = [send, (counts, offsets(counts)), MPI.BYTE]
        else:
            self._mpi(self.mpi_comm, "Scatter", None, size, root=root)
            spec = None
        out = np.empty(int(size[0]), dtype=np.uint8)
        self._mpi(self.mpi_comm, "Scatterv", spec, [out, MPI.BYTE], root=root)
        return out

    def _alltoall_raw(self, parts: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int], list[int]]:
        send_counts = [int(p.size) for p in parts]
        sizes = np.empty(self.size, dtype=np.int64)
        self._mpi(self.mpi_comm, "Alltoall", np.array(send_counts, dtype=np.int64), sizes)
        recv_counts = [int(c) for c in sizes]
        recv_displs = offsets(recv_counts)
        send = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)
        raw = np.empty(sum(recv_counts), dtype=np.uint8)
        self._mpi(
            self.mpi_comm,
            "Alltoallv",
            [send, (send_counts, offsets(send_counts)), MPI.BYTE],
            [raw, (recv_counts, recv_displs), MPI.BYTE],
        )
        return raw, recv_counts, recv_displs

    # -- reductions -------------------------------------------------------------------------------

    def _chunks(self, buf: np.ndarray) -> list[np.ndarray]:
        flat = buf.reshape(-1)
        step = max(1, self.bucket_bytes // max(1, flat.itemsize))
        return [flat[i : i + step] for i in range(0, flat.size, step)] or [flat]

    def _allreduce_into(self, send: np.ndarray, recv: np.ndarray, op: MPI.Op) -> None:
        """All-reduce the contiguous ``send`` into ``recv`` (the same array: in place), in
        bucket-sized pieces."""
        in_place = send is recv
        for s_piece, r_piece in zip(self._chunks(send), self._chunks(recv), strict=True):
            self._mpi(
                self.mpi_comm, "Allreduce", MPI.IN_PLACE if in_place else s_piece, r_piece, op
            )

    def _reduce_arrays(self, arrays: list[np.ndarray], scale: float) -> None:
        """Sum host ``arrays`` over ranks in place, times ``scale``: in buckets, one collective
        per bucket, the scale fused into unpacking."""
        if not arrays:
            return
        wire = self.allreduce_grad_dtype or np.result_type(*arrays)
        wire = arr.reduction_dtype(np.dtype(wire))
        shm = self._shm if wire.kind in "fiuc" else None
        if shm is not None:
            plan = self._plans.get(arrays, wire, shm.slot_bytes, tag="shared")
        else:
            # over MPI, packing costs two extra passes: only small arrays are worth it
            plan = self._plans.get(
                arrays, wire, self.bucket_bytes, tag="mpi", own_bucket_bytes=OWN_BUCKET_BYTES
            )
        flats, flush = arr.contiguous_views(arrays)
        if shm is not None and shm.size == self.size:
            # every rank maps the segment: the mean completes in it, buckets pipelined
            shm.mean_buckets(plan.pieces(flats), scale, self._sync, self._watchdog)
        elif shm is not None:
            for views, buf in plan.pieces(flats):
                self._shared_mean(shm, views, buf, scale)
        else:
            plan.run(flats, lambda buf: self._allreduce_into(buf, buf, MPI.SUM), scale)
        flush()

    def _sync(self) -> None:
        """A barrier inside a collective (timed by the watchdog like the collective)."""
        self._mpi(self.mpi_comm, "Barrier")

    def _make_comms(self) -> None:
        """Hook for subclasses: create further MPI communicators (collective, in __init__)."""

    def _create_shared_memory(self) -> SharedMemoryReducer | None:
        """The shared-memory bucket reducer (collective, in __init__); None when the ranks span
        hosts or no segment could be made."""
        if self.size == 1:
            return None
        slot = shared_memory.slot_size(self.bucket_bytes, self.size)
        return SharedMemoryReducer.create(self.mpi_comm, slot)

    def _shared_mean(
        self, shm: SharedMemoryReducer, views: list[np.ndarray], buf: np.ndarray, scale: float
    ) -> None:
        """One bucket's mean through shared memory."""
        shm.mean(views, buf, scale, self._sync)

    def _reduce_staged(self, arrays: list[Any], scale: float) -> None:
        """:meth:`_reduce_arrays` for numpy or CuPy arrays (CuPy staged through the host)."""
        hosts = [arr.to_host(a) for a in arrays]
        self._reduce_arrays(hosts, scale)
        for a, h in zip(arrays, hosts, strict=True):
            if arr.is_cupy(a):
                arr.write_back(a, h)

    def allreduce(self, x: Any, op: str = "sum") -> Any:
        """A new array: ``x`` reduced elementwise over ranks with ``op``."""
        host = arr.to_host(x)
        mpi_op = arr.mpi_op(op)
        self._enter(CallSignature.of("allreduce", [host], op=op))
        wire = arr.reduction_dtype(host.dtype)
        buf = np.array(host, dtype=wire, order="C", copy=True)
        self._allreduce_into(buf, buf, mpi_op)
        out = buf.astype(host.dtype, copy=False)
        return arr.like(out, x)

    def all_reduce(self, arrays: list[Any], division: bool = False) -> None:
        """Sum each array of ``arrays`` over ranks, in place; divided by size if ``division``."""
        arrays = list(arrays)
        self._enter(CallSignature.of("all_reduce", arrays))
        self._reduce_staged(arrays, 1.0 / self.size if division else 1.0)

    def multi_node_mean_grad(self, model: Any, zero_fill: bool = False) -> None:
        """Average every parameter's ``.grad`` over ranks, in place.

        ``zero_fill=True``: a parameter whose grad is None (but whose data exists) gets a zero
        grad first, so every rank reduces the same arrays. ``zero_fill=False``: such parameters
        are skipped, and every rank must then skip the same ones (``MNIFY_DEBUG=1`` checks).
        """
        names, grads = grads_to_reduce(model, zero_fill)
        self._enter(
            CallSignature.of("multi_node_mean_grad", grads, names=names)
            if self._debug
            else CallSignature("multi_node_mean_grad")
        )
        self._reduce_staged(grads, 1.0 / self.size)

    # -- broadcasts -------------------------------------------------------------------------------

    def bcast(self, x: Any, root: int = 0) -> Any:
        """Root's ``x`` on every rank (non-roots may pass None)."""
        self._enter(CallSignature("bcast", root=root))
        host = arr.to_host(x) if self.rank == root else None
        header = pickle.loads(
            self._bcast_bytes(pickle.dumps(header_of(host)) if host is not None else None, root)
        )
        dtype, shape = header
        if host is not None:
            raw = as_bytes(host).copy()
        else:
            raw = np.empty(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, np.uint8)
        for piece in self._chunks(raw):
            self._mpi(self.mpi_comm, "Bcast", [piece, MPI.BYTE], root=root)
        out = from_bytes(raw, header)
        return arr.like(out, x) if x is not None else out

    def bcast_data(self, model: Any, root: int = 0) -> None:
        """Copy root's parameter arrays (``model.namedparams()``) into every rank, in place.

        Parameters whose data is None (not yet initialised) are skipped; ranks must agree on
        which those are.
        """
        named = [
            (n, p.data) for n, p in named_params(model) if getattr(p, "data", None) is not None
        ]
        arrays = [d for _, d in named]
        self._enter(CallSignature.of("bcast_data", arrays, root=root, names=[n for n, _ in named]))
        if not arrays:
            return
        is_root = self.rank == root
        # device arrays: download on root only; elsewhere they are overwritten anyway
        hosts = [
            arr.to_host(a) if is_root or not arr.is_cupy(a) else np.empty(a.shape, a.dtype)
            for a in arrays
        ]
        flats, flush = arr.contiguous_views(hosts)
        raw = [f.view(np.uint8) for f in flats]
        plan = self._plans.get(raw, np.dtype(np.uint8), self.bucket_bytes, tag="bcast")
        for views, buf in plan.pieces(raw):
            if len(views) == 1:  # a large array: straight from/into its own memory
                self._mpi(self.mpi_comm, "Bcast", [views[0], MPI.BYTE], root=root)
                continue
            if is_root:
                kernels.pack(views, buf)
            self._mpi(self.mpi_comm, "Bcast", [buf, MPI.BYTE], root=root)
            if not is_root:
                kernels.unpack(buf, views)
        flush()
        if not is_root:
            for a, h in zip(arrays, hosts, strict=True):
                if arr.is_cupy(a):
                    arr.write_back(a, h)

    # -- gathers and scatters (shapes may differ per rank) ------------------------------------------

    def gather(self, x: Any, root: int = 0) -> list[Any] | None:
        """Every rank's ``x`` as a list on root (None elsewhere); shapes may differ."""
        host = arr.to_host(x)
        self._enter(CallSignature.of("gather", [host], root=root))
        headers = self._gather_raw(np.frombuffer(pickle.dumps(header_of(host)), np.uint8), root)
        gathered = self._gather_raw(as_bytes(host), root)
        if headers is None or gathered is None:
            return None
        hraw, hcounts, hdispls = headers
        raw, counts, displs = gathered
        return [
            arr.like(from_bytes(raw[d : d + n], pickle.loads(hraw[hd : hd + hn].tobytes())), x)
            for d, n, hd, hn in zip(displs, counts, hdispls, hcounts, strict=True)
        ]

    def allgather(self, x: Any) -> list[Any]:
        """Every rank's ``x`` as a list on every rank; shapes may differ."""
        host = arr.to_host(x)
        self._enter(CallSignature.of("allgather", [host]))
        headers = [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(header_of(host)))]
        raw, counts, displs = self._allgather_raw(as_bytes(host))
        return [
            arr.like(from_bytes(raw[d : d + n], h), x)
            for d, n, h in zip(displs, counts, headers, strict=True)
        ]

    def alltoall(self, xs: Sequence[Any]) -> list[Any]:
        """Rank r sends ``xs[s]`` to rank s and gets back the list of what each rank sent it."""
        if len(xs) != self.size:
            raise ValueError(f"alltoall needs {self.size} arrays (one per rank), got {len(xs)}")
        hosts = [arr.to_host(x) for x in xs]
        self._enter(CallSignature.of("alltoall", hosts[:1]))
        hparts = [np.frombuffer(pickle.dumps(header_of(h)), np.uint8) for h in hosts]
        hraw, hcounts, hdispls = self._alltoall_raw(hparts)
        raw, counts, displs = self._alltoall_raw([as_bytes(h) for h in hosts])
        return [
            arr.like(from_bytes(raw[d : d + n], pickle.loads(hraw[hd : hd + hn].tobytes())), xs[0])
            for d, n, hd, hn in zip(displs, counts, hdispls, hcounts, strict=True)
        ]

    def scatter(self, xs: Sequence[Any] | None, root: int = 0) -> Any:
        """Root's ``xs[r]`` arrives at rank r (non-roots pass None); shapes may differ."""
        hosts: list[np.ndarray] | None = None
        if self.rank == root:
            if xs is None or len(xs) != self.size:
                got = "None" if xs is None else f"{len(xs)} arrays"
                raise ValueError(f"scatter root needs {self.size} arrays (one per rank), got {got}")
            hosts = [arr.to_host(x) for x in xs]
        self._enter(CallSignature("scatter", root=root))
        hparts = (
            [np.frombuffer(pickle.dumps(header_of(h)), np.uint8) for h in hosts]
            if hosts is not None
            else None
        )
        header = pickle.loads(self._scatter_raw(hparts, root).tobytes())
        raw = self._scatter_raw([as_bytes(h) for h in hosts] if hosts is not None else None, root)
        out = from_bytes(raw, header)
        return arr.like(out, xs[0]) if xs is not None and self.rank == root else out

    # -- point to point -----------------------------------------------------------------------------

    def _send_message(self, kind: str, header: Any, data: np.ndarray, dest: int, tag: int) -> None:
        head = np.frombuffer(pickle.dumps((kind, header)), dtype=np.uint8)
        size = np.array([head.size], dtype=np.int64)
        c = self.mpi_comm
        self._wait_all(
            [
                c.Isend(size, dest=dest, tag=tag),
                c.Isend([head, MPI.BYTE], dest=dest, tag=tag),
                c.Isend([data, MPI.BYTE], dest=dest, tag=tag),
            ]
        )

    def _recv_message(self, kind: str, source: int, tag: int) -> tuple[Any, np.ndarray]:
        size = np.empty(1, dtype=np.int64)
        status = MPI.Status()
        rank_state.wait_begins()
        try:
            if self._watchdog is None:
                self.mpi_comm.Recv(size, source=source, tag=tag, status=status)
            else:
                self._watchdog.wait(self.mpi_comm.Irecv(size, source=source, tag=tag), status)
        finally:
            rank_state.wait_ends()
        # the rest of the message comes from whoever sent the first part (ANY_SOURCE/ANY_TAG)
        source, tag = status.Get_source(), status.Get_tag()
        head = np.empty(int(size[0]), dtype=np.uint8)
        self._mpi(self.mpi_comm, "Recv", [head, MPI.BYTE], source=source, tag=tag)
        sent_kind, header = pickle.loads(head.tobytes())
        if sent_kind != kind:
            raise CollectiveMismatch(
                f"recv{'_obj' if kind == _OBJECT else ''}: rank {self.rank} expected "
                f"{'an object' if kind == _OBJECT else 'an array'} from rank {source} (tag {tag}) "
                f"but rank {source} sent {'an object' if sent_kind == _OBJECT else 'an array'}"
            )
        nbytes = (
            int(header)
            if kind == _OBJECT
            else int(np.prod(header[1], dtype=np.int64)) * np.dtype(header[0]).itemsize
        )
        data = np.empty(nbytes, dtype=np.uint8)
        self._mpi(self.mpi_comm, "Recv", [data, MPI.BYTE], source=source, tag=tag)
        return header, data

    def send(self, x: Any, dest: int, tag: int = 0) -> None:
        host = arr.to_host(x)
        self._enter_p2p("send", dest)
        self._send_message(_ARRAY, header_of(host), as_bytes(host), dest, tag)

    def recv(self, source: int, tag: int = 0) -> np.ndarray:
        """The array rank ``source`` sent with ``tag`` (as numpy; callers move it to a device)."""
        self._enter_p2p("recv", source)
        header, data = self._recv_message(_ARRAY, source, tag)
        return from_bytes(data, header)

    def send_obj(self, obj: Any, dest: int, tag: int = 0) -> None:
        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        self._enter_p2p("send_obj", dest)
        self._send_message(_OBJECT, payload.size, payload, dest, tag)

    def recv_obj(self, source: int, tag: int = 0) -> Any:
        self._enter_p2p("recv_obj", source)
        _, data = self._recv_message(_OBJECT, source, tag)
        return pickle.loads(data.tobytes())

    # -- object collectives (pickled) ---------------------------------------------------------------

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        self._enter(CallSignature("bcast_obj", root=root))
        payload = pickle.dumps(obj) if self.rank == root else None
        raw = self._bcast_bytes(payload, root)
        return obj if self.rank == root else pickle.loads(raw)

    def gather_obj(self, obj: Any, root: int = 0) -> list[Any] | None:
        self._enter(CallSignature("gather_obj", root=root))
        gathered = self._gather_raw(np.frombuffer(pickle.dumps(obj), np.uint8), root)
        if gathered is None:
            return None
        raw, counts, displs = gathered
        return [pickle.loads(raw[d : d + n].tobytes()) for d, n in zip(displs, counts, strict=True)]

    def allgather_obj(self, obj: Any) -> list[Any]:
        self._enter(CallSignature("allgather_obj"))
        return [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(obj))]

    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any:
        """``op`` over every rank's object, folded in rank order (the same result everywhere)."""
        arr.mpi_op(op)
        self._enter(CallSignature("allreduce_obj", op=op))
        values = [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(obj))]
        result = values[0]
        for v in values[1:]:
            if op == "sum":
                result = result + v
            elif op == "prod":
                result = result * v
            elif op == "max":
                result = max(result, v)
            else:
                result = min(result, v)
        return result

    def scatter_obj(self, objs: Sequence[Any] | None, root: int = 0) -> Any:
        parts = None
        if self.rank == root:
            if objs is None or len(objs) != self.size:
                raise ValueError(f"scatter_obj root needs {self.size} objects (one per rank)")
            parts = [np.frombuffer(pickle.dumps(o), np.uint8) for o in objs]
        self._enter(CallSignature("scatter_obj", root=root))
        return pickle.loads(self._scatter_raw(parts, root).tobytes())

    # -- ChainerMN compatibility: aliases and runtime configuration -------------------------------

    def allreduce_grad(self, model: Any, zero_fill: bool = False) -> None:
        """ChainerMN's older name for :meth:`multi_node_mean_grad`."""
        self.multi_node_mean_grad(model, zero_fill)

    def broadcast_data(self, model: Any) -> None:
        """ChainerMN's older name for :meth:`bcast_data`."""
        self.bcast_data(model)

    CONFIG_NAMES: ClassVar[tuple[str, ...]] = (
        "allreduce_grad_dtype",
        "bucket_bytes",
        "batched_copy",
    )

    def set_config(self, name: str, value: Any = True, **kwargs: Any) -> None:
        """ChainerMN's ``comm.set_config``: ``allreduce_grad_dtype`` (bucket dtype, None for the
        gradients' own), ``bucket_bytes``; ``batched_copy`` is accepted and ignored (host
        communicators always pack)."""
        if name == "allreduce_grad_dtype":
            self.allreduce_grad_dtype = None if value is None else np.dtype(value)
        elif name == "bucket_bytes":
            if int(value) <= 0:
                raise ValueError(f"bucket_bytes must be positive, got {value}")
            self.bucket_bytes = int(value)
        elif name == "batched_copy":
            self._batched_copy = bool(value)
        else:
            raise ValueError(f"unknown config {name!r}; expected one of {self.CONFIG_NAMES}")

    def get_config(self, name: str | None = None) -> Any:
        values = {
            "allreduce_grad_dtype": self.allreduce_grad_dtype,
            "bucket_bytes": self.bucket_bytes,
            "batched_copy": self._batched_copy,
        }
        if name is None:
            return values
        if name not in values:
            raise ValueError(f"unknown config {name!r}; expected one of {self.CONFIG_NAMES}")
        return values[name]

    @contextlib.contextmanager
    def config_scope(self) -> Iterator[None]:
        """Configuration changed inside the block is restored when it ends."""
        saved = self.get_config()
        self._config_depth += 1
        try:
            yield
        finally:
            self._config_depth -= 1
            for key, val in saved.items():
                self.set_config(key, val)

    @property
    def within_config_scope(self) -> bool:
        return self._config_depth > 0

    # -- the rest -----------------------------------------------------------------------------------

    def barrier(self) -> None:
        """Wait for every rank. Never timed by the watchdog: it is the explicit synchronisation
        point to put before timed collectives when ranks legitimately drift apart (rank 0
        evaluating while the others wait, seed 000)."""
        self._enter(CallSignature("barrier"), timed=False)
        self._mpi(self.mpi_comm, "Barrier")

    def __copy__(self) -> CommunicatorBase:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> CommunicatorBase:
        # A communicator is a handle on the job, not data: a deep copy of a model that holds one
        # (``Link.copy(mode='copy')``, ``copy.deepcopy(model)``) must share it, not fail to pickle
        # an MPI communicator.
        return self

    def split(self, color: int, key: int) -> CommunicatorBase:
        """A communicator of the same class over the ranks that passed the same ``color``,
        ordered by ``key``."""
        self._enter(CallSignature("split"))
        sub = cast(MPI.Intracomm, self.mpi_comm.Split(color, key))
        try:
            return type(self)(sub, **self._split_settings())
        finally:
            sub.Free()

    def _split_settings(self) -> dict[str, Any]:
        """Constructor settings a communicator made by :meth:`split` inherits from this one."""
        return {
            "allreduce_grad_dtype": self.allreduce_grad_dtype,
            "bucket_bytes": self.bucket_bytes,
        }

    def _free_comms(self) -> None:
        """Free the MPI communicators this instance owns (subclasses add theirs)."""
        self.mpi_comm.Free()

    def finalize(self) -> None:
        """Stop the watchdog and free the duplicated communicators (idempotent)."""
        if self._finalized:
            return
        self._finalized = True
        if self._watchdog is not None:
            self._watchdog.close()
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        if not MPI.Is_finalized():
            self._free_comms()
