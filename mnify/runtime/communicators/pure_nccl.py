"""``pure_nccl``: collectives on CuPy arrays through NCCL, one NCCL communicator over all ranks.

ChainerMN's ``pure_nccl``. Each rank drives one GPU, chosen from what the process sees
(:func:`choose_device`: GPU ``intra_rank`` when every rank of a host sees all of them, GPU 0
when ``CUDA_VISIBLE_DEVICES`` gives each rank its own) and made current at construction, so the
caller's arrays and streams land on it; two ranks of a host on one GPU are refused then, as
NCCL would refuse them later. The NCCL communicator is created lazily, at the first collective
that needs it: rank 0 makes the unique id, MPI broadcasts its 128 bytes, every rank joins
(``ncclCommInitRank``; CuPy 14 takes the id as ``bytes``, CuPy 13 as a tuple of C chars). GPU
work is queued on the caller's current CuPy stream (or the ``stream`` given), so it orders after
the kernels that produced the data and the host does not wait for it. Every buffer a reduction
uses (contiguous twins of strided gradients, staging buckets) is allocated under the stream
that reads it, so CuPy's per-stream pool never hands it to another stream's next allocation
while it is still read; every NCCL launch on the GPU is chained to the previous one with an
event (:mod:`~mnify.runtime.communicators.nccl_order`), so two NCCL communicators (the overlap
scheduler's and this one) or two streams never run NCCL kernels in an unagreed order.

- Gradient averaging cuts the gradients into buckets with the host communicators' planner
  (:mod:`~mnify.runtime.communicators.buckets`): without an explicit ``bucket_bytes`` everything
  is one bucket (NCCL pipelines large buffers itself). A bucket is packed with one kernel
  launch (cast to ``allreduce_grad_dtype``), all-reduced with NCCL, and unpacked with one
  launch; a bucket that is one array already in the wire dtype is reduced in place. The 1/size
  of the mean is NCCL's own average (``ncclAvg``, NCCL >= 2.10) on float32/float64 wires, and
  otherwise fused into packing (or applied in place), before the sum, so float16 sums do not
  overflow (:func:`~mnify.runtime.communicators.buckets.place_scale`).
- ``allreduce``, ``all_reduce``, ``bcast``, ``bcast_data``, ``allgather`` and ``alltoall``
  (grouped NCCL send/recv) run on NCCL when given CuPy arrays; numpy arrays, dtypes NCCL
  cannot reduce, and the rest (``gather``, ``scatter``, ``send``/``recv``, the object
  collectives) use the base class's MPI path with host staging.
- ``MNIFY_WATCHDOG_TIMEOUT``: after queueing an NCCL collective the caller waits for it with a
  deadline; on expiry the NCCL communicator is aborted (so the GPU stops waiting too) and
  :class:`~mnify.runtime.errors.CollectiveTimeout` names the ranks that never arrived.
  ``ncclCommInitRank`` itself blocks in C and cannot be bounded.

Every rank must pass arrays of the same kind (all CuPy or all numpy) to a collective.
:func:`nccl_status` tells, without raising, whether this process could run ``pure_nccl``.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from mnify.runtime import kernels
from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators.base import CommunicatorBase
from mnify.runtime.communicators.buckets import place_scale, reduced_in_place
from mnify.runtime.communicators.nccl_order import launch_order
from mnify.runtime.communicators.parameters import grads_to_reduce, named_params
from mnify.runtime.debug import CallSignature
from mnify.runtime.errors import CollectiveTimeout

# numpy dtype name -> name of cupy.cuda.nccl's constant
NCCL_DTYPES: dict[str, str] = {
    "int8": "NCCL_INT8",
    "uint8": "NCCL_UINT8",
    "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32",
    "int64": "NCCL_INT64",
    "uint64": "NCCL_UINT64",
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
}
NCCL_OPS: dict[str, str] = {
    "sum": "NCCL_SUM",
    "prod": "NCCL_PROD",
    "max": "NCCL_MAX",
    "min": "NCCL_MIN",
}
# wire dtypes for gradient buckets (what the pack kernel can write)
WIRE_DTYPES = frozenset({"float16", "float32", "float64"})

# NCCL_VERSION_CODE of the first release with ncclAvg (2.10.0)
NCCL_AVG_SINCE = 21000
UNIQUE_ID_BYTES = 128


def format_nccl_version(code: int) -> str:
    """NCCL's integer version code as ``major.minor.patch`` (2.9+ and older encodings)."""
    if code <= 0:
        return "unknown"
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def nccl_status() -> tuple[bool, str]:
    """(whether ``pure_nccl`` can run in this process, why or why not); never raises.

    Checks CuPy, a visible CUDA device, and CuPy's NCCL binding with a loadable library.
    """
    try:
        import cupy  # type: ignore[import-not-found]
    except Exception as exc:  # ImportError, or a broken CUDA install failing at import
        return False, f"CuPy is not importable ({type(exc).__name__}: {exc}); install cupy-cudaXXx"
    version = getattr(cupy, "__version__", "?")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return False, f"CuPy {version} sees no CUDA driver/device ({type(exc).__name__}: {exc})"
    if count == 0:
        return False, f"CuPy {version} sees no CUDA device"
    try:
        from cupy.cuda import nccl  # type: ignore[import-not-found]
    except Exception as exc:
        return False, f"CuPy {version} has no NCCL binding ({type(exc).__name__}: {exc})"
    if not getattr(nccl, "available", False):
        return False, f"CuPy {version} was built without NCCL (cupy.cuda.nccl.available is False)"
    try:
        nccl_version = format_nccl_version(int(nccl.get_version()))
    except Exception as exc:
        return False, f"NCCL library not loadable by CuPy {version} ({type(exc).__name__}: {exc})"
    return True, f"CuPy {version}, NCCL {nccl_version}, {count} CUDA device(s)"


def choose_device(intra_rank: int, visible: int) -> int:
    """The CUDA device (as this process numbers them) for the rank ``intra_rank`` of a host.

    Every rank seeing all of the host's GPUs: GPU ``intra_rank``. Ranks isolated with
    ``CUDA_VISIBLE_DEVICES`` see one GPU each: GPU 0. In between (each rank sees a group of
    GPUs), ``intra_rank`` modulo what it sees; a clash is caught by the bus-id check.
    """
    if visible <= 0:
        raise RuntimeError("pure_nccl: no CUDA device is visible to this process")
    return intra_rank % visible


def unique_id_bytes(uid: bytes | Sequence[int]) -> bytes:
    """The 128 bytes of an NCCL unique id as CuPy returned it: ``bytes`` (CuPy >= 14) or a
    tuple of C ``char`` values, negative where ``char`` is signed (CuPy 13)."""
    raw = bytes(uid) if isinstance(uid, bytes | bytearray) else bytes(int(c) & 0xFF for c in uid)
    if len(raw) != UNIQUE_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(raw)}")
    return raw


def cupy_major(version: str) -> int:
    """The major version of a CuPy version string (``"14.0.0rc1"`` -> 14; 0 if unreadable)."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def join_nccl(nccl: Any, cupy_version: str, ndev: int, uid: bytes, rank: int) -> Any:
    """``NcclCommunicator(ndev, id, rank)`` with the id in the form this CuPy takes.

    CuPy >= 14 declares ``bytes commId``. CuPy 13 declares ``tuple commId`` and stores each item
    into a C ``char``: signed on x86-64 (values -128..127), unsigned on aarch64 (0..255), so a
    value out of range raises OverflowError before NCCL is called, and the other form is tried.
    """
    if cupy_major(cupy_version) >= 14:
        return nccl.NcclCommunicator(ndev, uid, rank)
    signed = tuple(b - 256 if b > 127 else b for b in uid)
    try:
        return nccl.NcclCommunicator(ndev, signed, rank)
    except OverflowError:
        return nccl.NcclCommunicator(ndev, tuple(uid), rank)


def can_average(nccl: Any) -> bool:
    """Whether reductions can use ``ncclAvg``: CuPy names it and the loaded NCCL has it."""
    if not hasattr(nccl, "NCCL_AVG"):
        return False
    try:
        return int(nccl.get_version()) >= NCCL_AVG_SINCE
    except Exception:
        return False


def _describe(x: Any) -> tuple[bool, str, tuple[int, ...]]:
    """(is a CuPy array, dtype string, shape): what ranks exchange before a device transfer."""
    a = x if arr.is_cupy(x) else np.asarray(x)
    return arr.is_cupy(x), np.dtype(a.dtype).str, tuple(int(d) for d in a.shape)


class PureNcclCommunicator(CommunicatorBase):
    """NCCL collectives on the GPU ``intra_rank`` (or ``device``), MPI for the rest.

    Collective: every rank must construct it. Raises ``RuntimeError`` saying what is missing
    when CuPy, a CUDA device or NCCL is not there.
    """

    name = "pure_nccl"

    def __init__(
        self,
        mpi_comm: MPI.Intracomm | None = None,
        *,
        allreduce_grad_dtype: Any = None,
        bucket_bytes: int | None = None,
        inter_host_dtype: Any = None,
        device: int | None = None,
    ) -> None:
        ok, why = nccl_status()
        if not ok:
            raise RuntimeError(
                f"the pure_nccl communicator cannot run here: {why}. "
                "On CPU ranks use create_communicator('flat') (or 'naive', 'hierarchical')."
            )
        import cupy
        from cupy.cuda import nccl

        super().__init__(
            mpi_comm,
            allreduce_grad_dtype=allreduce_grad_dtype,
            bucket_bytes=bucket_bytes,
            inter_host_dtype=inter_host_dtype,
        )
        if (
            self.allreduce_grad_dtype is not None
            and self.allreduce_grad_dtype.name not in WIRE_DTYPES
        ):
            raise ValueError(
                f"allreduce_grad_dtype must be float16, float32 or float64, "
                f"got {self.allreduce_grad_dtype}"
            )
        self._cupy = cupy
        self._nccl = nccl
        count = int(cupy.cuda.runtime.getDeviceCount())
        self.device_id = choose_device(self.intra_rank, count) if device is None else int(device)
        if not 0 <= self.device_id < count:
            raise RuntimeError(
                f"pure_nccl: rank {self.rank} on host {self.host_name!r} was given GPU "
                f"{self.device_id} but only {count} device(s) are visible to it"
            )
        self._device = cupy.cuda.Device(self.device_id)
        # current from now on: the caller's arrays and streams are made on this GPU
        self._device.use()
        self._refuse_shared_gpus()
        # None: one bucket for everything (bucket_bytes not given explicitly)
        self._device_bucket_bytes: int | None = int(bucket_bytes) if bucket_bytes else None
        self._can_average = can_average(nccl)
        self._nccl_comm: Any = None
        # every NCCL launch on this GPU (this communicator's, a split's, the overlap channel's)
        # runs in the order it was queued, whatever the stream
        self._order = launch_order(cupy, self.device_id)

    def _refuse_shared_gpus(self) -> None:
        """Collective: raise on every rank when two ranks of a host drive one GPU (NCCL
        refuses that only later, inside ncclCommInitRank, as "Duplicate GPU detected")."""
        try:
            bus = str(self._device.pci_bus_id)
        except Exception:  # no bus id from this driver: nothing to compare
            bus = ""
        seen = self.mpi_comm.allgather((self.host_name, bus))
        mine = (self.host_name, bus)
        sharing = [r for r, entry in enumerate(seen) if entry == mine]
        if bus and len(sharing) > 1:
            raise RuntimeError(
                f"pure_nccl: ranks {sharing} on host {self.host_name!r} all use the GPU at PCI "
                f"bus {bus}; NCCL needs one GPU per rank. Start at most as many ranks per host "
                "as it has GPUs, or give each rank its own with CUDA_VISIBLE_DEVICES."
            )

    # -- NCCL plumbing ------------------------------------------------------------------------------

    def _nccl_communicator(self) -> Any:
        """The NCCL communicator, created on first use (collective over all ranks)."""
        if self._nccl_comm is None:
            mine = unique_id_bytes(self._nccl.get_unique_id()) if self.rank == 0 else None
            uid = self._bcast_bytes(mine, root=0)
            version = str(getattr(self._cupy, "__version__", ""))
            with self._device:
                self._nccl_comm = join_nccl(self._nccl, version, self.size, uid, self.rank)
        return self._nccl_comm

    def _nccl_dtype(self, dtype: Any) -> int:
        return int(getattr(self._nccl, NCCL_DTYPES[np.dtype(dtype).name]))

    def _nccl_op(self, op: str) -> int:
        return int(getattr(self._nccl, NCCL_OPS[op]))

    def _stream(self, stream: Any) -> Any:
        return stream if stream is not None else self._cupy.cuda.get_current_stream()

    def _check_stream(self, stream: Any) -> None:
        """A stream made under another device cannot be entered under this one (CuPy raises
        deep inside); say which devices instead."""
        made_on = getattr(stream, "device_id", -1)
        if stream is not None and made_on not in (-1, self.device_id):
            raise ValueError(
                f"pure_nccl runs on device {self.device_id} but the stream given was made on "
                f"device {made_on}; make it after creating the communicator (which selects its "
                "device) or under `with cupy.cuda.Device(comm.device_id):`"
            )

    def _after_current(self, stream: Any) -> Any:
        """``stream`` (default: the current one), made to wait for the work already queued on
        the current stream -- the kernels that computed the gradients -- without the host
        waiting."""
        current = self._cupy.cuda.get_current_stream()
        if stream is None or stream.ptr == current.ptr:
            return current
        ready = self._cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(current)
        stream.wait_event(ready)
        return stream

    def _settle(self, stream: Any, started: float) -> None:
        """Under the watchdog: wait for the queued NCCL work with the collective's deadline."""
        dog = self._watchdog
        if dog is None:
            return
        event = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        deadline = started + dog.timeout
        pause = 5e-5
        while not event.done:
            if time.monotonic() > deadline:
                missing = dog.missing_ranks(dog.entered)
                self._abort_nccl()
                raise CollectiveTimeout(dog.kind, dog.entered, self.rank, dog.timeout, missing)
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def _abort_nccl(self) -> None:
        comm, self._nccl_comm = self._nccl_comm, None
        if comm is not None:
            try:
                comm.abort()
            except Exception:
                comm.destroy()

    def _allocate(self, n: int, dtype: np.dtype[Any]) -> Any:
        """A plan's staging buffer on this communicator's GPU."""
        with self._device:
            return self._cupy.empty(n, dtype=dtype)

    def _on_device(self, arrays: Sequence[Any]) -> bool:
        return bool(arrays) and all(arr.is_cupy(a) for a in arrays)

    # -- reductions -------------------------------------------------------------------------------

    def _reduce_device(self, arrays: list[Any], scale: float, stream: Any = None) -> None:
        """Sum CuPy ``arrays`` over ranks in place, times ``scale``: planned buckets, NCCL."""
        cupy = self._cupy
        with self._device:
            self._check_stream(stream)
            wire = self.allreduce_grad_dtype or np.result_type(*[a.dtype for a in arrays])
            wire = np.dtype(wire)
            if wire.name not in WIRE_DTYPES:  # integer arrays: reduce in float64, exact enough
                wire = np.dtype(np.float64)
            placement = place_scale(scale, wire, self.size if self._can_average else None)
            op = self._nccl.NCCL_AVG if placement.average else self._nccl_op("sum")
            stream = self._after_current(stream)
            comm = self._nccl_communicator()
            started = time.monotonic()
            nccl_wire = self._nccl_dtype(wire)
            # Everything from here runs on the reducing stream, and every buffer it uses is
            # allocated under it: CuPy's pool keeps one arena per stream, so a contiguous twin
            # or staging buffer returns (when dropped) to the arena of the stream that still
            # reads it, where the next allocation is ordered after that work.
            with stream:
                flats: list[Any] = []
                write_back: list[tuple[Any, Any]] = []
                for a in arrays:
                    if a.flags.c_contiguous:
                        flats.append(a.reshape(-1))
                    else:
                        tmp = cupy.ascontiguousarray(a)
                        write_back.append((a, tmp))
                        flats.append(tmp.reshape(-1))
                plan = self._plans.get(
                    flats,
                    wire,
                    self._device_bucket_bytes,
                    tag=("nccl", int(stream.ptr)),  # one staging buffer per stream
                    allocate=self._allocate,
                )
                for views, buf in plan.pieces(flats):
                    if reduced_in_place(views, wire):
                        target = views[0]
                        if placement.before != 1.0:
                            kernels.scale(target, placement.before)
                    else:
                        target = buf
                        kernels.pack(views, buf, placement.before)
                    ptr = target.data.ptr
                    self._order.before(stream)
                    comm.allReduce(ptr, ptr, int(target.size), nccl_wire, op, stream.ptr)
                    self._order.after(stream)
                    if target is buf:
                        kernels.unpack(buf, views)
                for original, tmp in write_back:
                    original[...] = tmp
            self._settle(stream, started)

    def allreduce(self, x: Any, op: str = "sum") -> Any:
        """A new array: ``x`` reduced over ranks with ``op`` (NCCL for CuPy arrays)."""
        if not arr.is_cupy(x) or np.dtype(x.dtype).name not in NCCL_DTYPES:
            return super().allreduce(x, op)
        arr.mpi_op(op)  # the same error for unknown ops as the other communicators
        self._enter(CallSignature.of("allreduce", [x], op=op))
        with self._device:
            stream = self._stream(None)
            comm = self._nccl_communicator()
            started = time.monotonic()
            src = self._cupy.ascontiguousarray(x)
            out = self._cupy.empty_like(src)
            if src.size:
                self._order.before(stream)
                comm.allReduce(
                    src.data.ptr,
                    out.data.ptr,
                    int(src.size),
                    self._nccl_dtype(src.dtype),
                    self._nccl_op(op),
                    stream.ptr,
                )
                self._order.after(stream)
            self._settle(stream, started)
        return out

    def all_reduce(self, arrays: list[Any], division: bool = False) -> None:
        """Sum each array over ranks in place (divided by size if ``division``), packed."""
        arrays = list(arrays)
        if not self._on_device(arrays):
            super().all_reduce(arrays, division)
            return
        self._enter(CallSignature.of("all_reduce", arrays))
        self._reduce_device(arrays, 1.0 / self.size if division else 1.0)

    def multi_node_mean_grad(
        self, model: Any, zero_fill: bool = False, *, stream: Any = None
    ) -> None:
        """Average every parameter's ``.grad`` over ranks in place, on ``stream`` (default:
        the current stream). See :meth:`CommunicatorBase.multi_node_mean_grad`."""
        names, grads = grads_to_reduce(model, zero_fill)
        if grads and not self._on_device(grads):
            super().multi_node_mean_grad(model, zero_fill)
            return
        self._enter(
            CallSignature.of("multi_node_mean_grad", grads, names=names)
            if self._debug
            else CallSignature("multi_node_mean_grad")
        )
        if grads:
            self._reduce_device(grads, 1.0 / self.size, stream)

    # -- broadcasts -------------------------------------------------------------------------------

    def _bcast_device(self, arrays: Sequence[Any], root: int) -> None:
        """Root's bytes of each contiguous CuPy array into the others', one NCCL group."""
        with self._device:
            stream = self._stream(None)
            comm = self._nccl_communicator()
            started = time.monotonic()
            self._order.before(stream)
            self._nccl.groupStart()
            try:
                for a in arrays:
                    if a.nbytes:
                        comm.bcast(
                            a.data.ptr, int(a.nbytes), self._nccl_dtype(np.uint8), root, stream.ptr
                        )
            finally:
                self._nccl.groupEnd()
            self._order.after(stream)
            self._settle(stream, started)

    def bcast(self, x: Any, root: int = 0) -> Any:
        """Root's ``x`` on every rank (non-roots may pass None); over NCCL when root's ``x`` is
        a CuPy array, and then every rank gets a CuPy array."""
        # entered first so the header exchange runs under this collective's watchdog deadline
        self._enter(CallSignature("bcast", root=root))
        header = _describe(x) if self.rank == root else None
        on_device, dtype, shape = pickle.loads(
            self._bcast_bytes(pickle.dumps(header) if header is not None else None, root)
        )
        if not on_device:
            return super().bcast(x, root)
        with self._device:
            if self.rank == root:
                out = self._cupy.array(x, order="C", copy=True)
            else:
                out = self._cupy.empty(shape, dtype=np.dtype(dtype))
        self._bcast_device([out], root)
        return out

    def bcast_data(self, model: Any, root: int = 0) -> None:
        """Root's parameter arrays into every rank in place (one NCCL group for CuPy params)."""
        named = [
            (n, p.data) for n, p in named_params(model) if getattr(p, "data", None) is not None
        ]
        arrays = [d for _, d in named]
        if not self._on_device(arrays):
            super().bcast_data(model, root)
            return
        self._enter(CallSignature.of("bcast_data", arrays, root=root, names=[n for n, _ in named]))
        work = [a if a.flags.c_contiguous else self._cupy.ascontiguousarray(a) for a in arrays]
        self._bcast_device(work, root)
        with self._device:
            for a, w in zip(arrays, work, strict=True):
                if w is not a:
                    a[...] = w

    # -- gathers -----------------------------------------------------------------------------------

    def allgather(self, x: Any) -> list[Any]:
        """Every rank's ``x`` on every rank (shapes may differ); NCCL when all pass CuPy arrays
        of one dtype (blocks padded to the largest), the MPI path otherwise."""
        mine = _describe(x)
        self._enter(CallSignature("allgather"))
        headers = [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(mine))]
        if not all(h[0] for h in headers) or len({h[1] for h in headers}) != 1:
            return super().allgather(x)
        cupy = self._cupy
        dtype = np.dtype(headers[0][1])
        sizes = [int(np.prod(h[2], dtype=np.int64)) for h in headers]
        block = max(sizes)
        with self._device:
            stream = self._stream(None)
            comm = self._nccl_communicator()
            started = time.monotonic()
            send = cupy.ascontiguousarray(x).reshape(-1)
            if send.size != block:
                padded = cupy.zeros(block, dtype=dtype)
                padded[: send.size] = send
                send = padded
            recv = cupy.empty(block * self.size, dtype=dtype)
            if block:
                self._order.before(stream)
                comm.allGather(
                    send.data.ptr,
                    recv.data.ptr,
                    int(block * dtype.itemsize),
                    self._nccl_dtype(np.uint8),
                    stream.ptr,
                )
                self._order.after(stream)
            self._settle(stream, started)
            return [
                recv[r * block : r * block + sizes[r]].reshape(headers[r][2])
                for r in range(self.size)
            ]

    def alltoall(self, xs: Sequence[Any]) -> list[Any]:
        """Rank r's ``xs[s]`` arrives at rank s (shapes may differ); over NCCL send/recv in one
        group when every rank passes CuPy arrays, the MPI path otherwise."""
        if len(xs) != self.size:
            raise ValueError(f"alltoall needs {self.size} arrays (one per rank), got {len(xs)}")
        mine = [_describe(x) for x in xs]
        first = xs[0] if arr.is_cupy(xs[0]) else np.asarray(xs[0])
        self._enter(CallSignature.of("alltoall", [first]))
        local = all(h[0] for h in mine)
        votes = self._allgather_bytes(bytes([local]))
        if not all(v == b"\x01" for v in votes):
            return super().alltoall(xs)
        hparts = [np.frombuffer(pickle.dumps(h), np.uint8) for h in mine]
        hraw, hcounts, hdispls = self._alltoall_raw(hparts)
        incoming = [
            pickle.loads(hraw[d : d + c].tobytes()) for d, c in zip(hdispls, hcounts, strict=True)
        ]
        cupy = self._cupy
        with self._device:
            stream = self._stream(None)
            comm = self._nccl_communicator()
            started = time.monotonic()
            sends = [cupy.ascontiguousarray(x) for x in xs]
            recvs = [cupy.empty(shape, dtype=np.dtype(dt)) for _, dt, shape in incoming]
            recvs[self.rank][...] = sends[self.rank]
            byte = self._nccl_dtype(np.uint8)
            self._order.before(stream)
            self._nccl.groupStart()
            try:
                for peer in range(self.size):
                    if peer == self.rank:
                        continue
                    if sends[peer].nbytes:
                        comm.send(
                            sends[peer].data.ptr, int(sends[peer].nbytes), byte, peer, stream.ptr
                        )
                    if recvs[peer].nbytes:
                        comm.recv(
                            recvs[peer].data.ptr, int(recvs[peer].nbytes), byte, peer, stream.ptr
                        )
            finally:
                self._nccl.groupEnd()
            self._order.after(stream)
            self._settle(stream, started)
        return recvs

    # -- the rest -----------------------------------------------------------------------------------

    def _split_settings(self) -> dict[str, Any]:
        """A split keeps this GPU; it gets its own NCCL communicator, created lazily."""
        return {
            "allreduce_grad_dtype": self.allreduce_grad_dtype,
            "bucket_bytes": self._device_bucket_bytes,
            "inter_host_dtype": self.inter_host_dtype,
            "device": self.device_id,
        }

    def finalize(self) -> None:
        """Release the NCCL communicator and the device buffers, then the MPI side."""
        if not self._finalized and self._nccl_comm is not None:
            with self._device:
                self._stream(None).synchronize()
                self._order.synchronize()  # NCCL work queued on other streams (double buffering)
                comm, self._nccl_comm = self._nccl_comm, None
                comm.destroy()
        self._plans.clear()
        super().finalize()
