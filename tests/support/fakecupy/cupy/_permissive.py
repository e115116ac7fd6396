"""A stand-in for CuPy + NCCL on CPU ranks, so the runtime's device paths run under real MPI in CI.

The one fake CuPy of the test suite (put ``tests/support/fakecupy`` first on ``sys.path``; see
``tests/support/fakecupy/__init__.py``). Not CuPy: "device" memory is host memory, and
``cupy.cuda.nccl`` performs each NCCL call with MPI on views made from the raw addresses -- the
same pointer/count/dtype calls pure_nccl makes to the real library. Streams and events are
immediate. ``mnify_fake_device`` (beside this package) replaces the CUDA kernels with their
numpy twins. Only COMM_WORLD-wide NCCL communicators are supported (ncclCommInitRank is
emulated with a collective Dup of COMM_WORLD).

Two kinds of device array, chosen when the package is imported:

- by default, numpy arrays of a subclass whose module is ``cupy`` (so ``is_cupy`` says yes and
  the kernels' numpy twins run on them), ``.data.ptr`` the host address;
- ``FAKE_CUPY_OPAQUE_ARRAYS=1``: arrays numpy cannot read, as CuPy's: ``np.asarray`` (any
  implicit conversion) raises CuPy's ``TypeError``, so only ``.get()``/``cupy.asnumpy`` reach
  the host. Tests of host staging use it; only the basic array surface exists in this mode.

Either way every host<->device copy is counted in ``TRANSFERS`` (``download``: ``get``,
``asnumpy``; ``upload``: ``asarray``/``array`` of host data).

It follows CuPy 14 (``get_unique_id()`` returns ``bytes``, ``NcclCommunicator`` takes ``bytes``);
``FAKE_CUPY_VERSION=13.6.0`` switches to CuPy 13 (a tuple of 128 C ``char`` values, signed as on
x86-64, and a ``tuple`` argument), each checked the way CuPy's Cython signature checks it. Devices
follow CUDA: ``FAKE_CUPY_DEVICES`` are visible (default 4), one is current, a stream belongs to
the device current when it was made and entering it under another raises as CuPy does, and
NCCL refuses two ranks on one GPU (PCI bus ids: device d of a process is bus
``FAKE_CUPY_FIRST_BUS + d``). ``FAKE_NCCL_VERSION`` is the library's version code (default
2.23.4); ``ncclAvg`` exists from 2.10 on.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
import types
from typing import Any

import numpy as np

__version__ = os.environ.get("FAKE_CUPY_VERSION", "14.2.0")
_CUPY_MAJOR = int(__version__.split(".")[0])


class CUDARuntimeError(RuntimeError):
    pass


_current_device = 0


def _visible() -> int:
    return int(os.environ.get("FAKE_CUPY_DEVICES", "4"))


def _set_device(device: int) -> None:
    global _current_device
    if not 0 <= device < _visible():
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
    _current_device = device


class _Memory:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def copy_from_device_async(self, src: _Memory, nbytes: int, stream: Any = None) -> None:
        ctypes.memmove(self.ptr, src.ptr, nbytes)


class Device:
    def __init__(self, device: int | Device | None = None) -> None:
        self.id = _current_device if device is None else int(getattr(device, "id", device))
        self._outer: list[int] = []

    def __enter__(self) -> Device:
        self._outer.append(_current_device)
        _set_device(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        _set_device(self._outer.pop())

    def use(self) -> Device:
        _set_device(self.id)
        return self

    @property
    def pci_bus_id(self) -> str:
        return f"0000:{int(os.environ.get('FAKE_CUPY_FIRST_BUS', '0')) + self.id:02x}:00.0"


# every host<->device copy, counted (tests of host staging read it)
TRANSFERS = {"download": 0, "upload": 0}

# CuPy's own words when numpy is handed a device array
_IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. "
    "Please use `.get()` to construct a NumPy array explicitly."
)
_OPAQUE = os.environ.get("FAKE_CUPY_OPAQUE_ARRAYS") == "1"


class _HostVisibleArray(np.ndarray):
    """The default device array: numpy underneath, so the kernels' numpy twins run on it."""

    @property  # type: ignore[override]
    def data(self) -> _Memory:
        return _Memory(int(self.ctypes.data))

    def __array_finalize__(self, obj: Any) -> None:
        # views keep their base's device; new arrays live on the current one
        self._device_id: int = getattr(obj, "_device_id", _current_device)

    @property  # type: ignore[override]
    def device(self) -> Device:
        return Device(self._device_id)

    def get(self, stream: Any = None) -> np.ndarray:
        TRANSFERS["download"] += 1
        return np.array(self.view(np.ndarray), copy=True)


class _OpaqueArray:
    """``FAKE_CUPY_OPAQUE_ARRAYS=1``: a device array numpy cannot read, as CuPy's.

    Holds host memory standing in for the device's; indexing gives views or copies as numpy's
    (and CuPy's) indexing does. Item assignment takes device arrays and scalars; a non-scalar
    numpy array is refused with CuPy's ``ValueError`` (CuPy routes it to ``fill``), so uploads
    go through ``cupy.asarray`` or ``.set()``. Anything that would hand the array to numpy
    raises CuPy's ``TypeError``.
    """

    def __init__(self, memory: np.ndarray, device_id: int) -> None:
        self._memory = memory
        self._device_id = device_id

    shape = property(lambda self: self._memory.shape)
    dtype = property(lambda self: self._memory.dtype)
    size = property(lambda self: self._memory.size)
    ndim = property(lambda self: self._memory.ndim)
    nbytes = property(lambda self: self._memory.nbytes)
    strides = property(lambda self: self._memory.strides)
    flags = property(lambda self: self._memory.flags)

    @property
    def data(self) -> _Memory:
        return _Memory(int(self._memory.ctypes.data))

    @property
    def device(self) -> Device:
        return Device(self._device_id)

    def get(self, stream: Any = None) -> np.ndarray:
        TRANSFERS["download"] += 1
        return self._memory.copy()

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(_IMPLICIT)

    def __len__(self) -> int:
        return len(self._memory)

    def __getitem__(self, key: Any) -> _OpaqueArray:
        return _OpaqueArray(self._memory[_device_key(key)], self._device_id)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, np.ndarray) and value.shape != ():
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        self._memory[_device_key(key)] = _memory(value)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Copy host ``arr`` (same shape) into this array: an upload."""
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(arr)}")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        TRANSFERS["upload"] += 1
        self._memory[...] = arr

    def copy(self) -> _OpaqueArray:
        return _OpaqueArray(self._memory.copy(), self._device_id)

    def astype(self, dtype: Any, copy: bool = True) -> _OpaqueArray:
        return _OpaqueArray(self._memory.astype(dtype, copy=copy), self._device_id)

    def reshape(self, *shape: Any) -> _OpaqueArray:
        return _OpaqueArray(self._memory.reshape(*shape), self._device_id)

    def ravel(self) -> _OpaqueArray:
        return _OpaqueArray(self._memory.ravel(), self._device_id)

    def __repr__(self) -> str:
        return f"array({self._memory.tolist()!r}, dtype={self.dtype}) (fake CuPy, opaque)"


for _cls in (_HostVisibleArray, _OpaqueArray):
    _cls.__name__ = _cls.__qualname__ = "ndarray"
ndarray = _OpaqueArray if _OPAQUE else _HostVisibleArray


def _is_device(x: Any) -> bool:
    return isinstance(x, (_HostVisibleArray, _OpaqueArray))


def _memory(x: Any) -> Any:
    """The host memory behind a device array (no transfer: the device's own view); anything
    else as it is."""
    if isinstance(x, _OpaqueArray):
        return x._memory
    if isinstance(x, _HostVisibleArray):
        return x.view(np.ndarray)
    return x


def _device_key(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(_memory(k) for k in key)
    return _memory(key)


def _wrap(x: Any) -> Any:
    """Host memory as a device array of this mode's kind on the current device (no copy)."""
    if _OPAQUE:
        return _OpaqueArray(np.asarray(x), _current_device)
    return np.asarray(x).view(_HostVisibleArray)


def _upload(x: Any, dtype: Any = None, order: str = "K") -> Any:
    """A device copy of ``x``: device to device, or an upload of host data."""
    if not _is_device(x):
        TRANSFERS["upload"] += 1
    return _wrap(np.array(_memory(x), dtype=dtype, order=order, copy=True))


def asarray(x: Any, dtype: Any = None) -> Any:
    if isinstance(x, ndarray) and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    return _upload(x, dtype)


def array(x: Any, dtype: Any = None, order: str = "K", copy: bool = True) -> Any:
    return _upload(x, dtype, order)


# what was queued on which stream, in order: "copy:<stream>" (a strided array made contiguous),
# "record:<stream>" (an event), "wait:<stream>" (a stream waiting on an event); tests read it
timeline: list[str] = []


def ascontiguousarray(x: Any) -> Any:
    if not _is_device(x):
        return _upload(x, order="C")
    if not _memory(x).flags.c_contiguous:
        timeline.append(f"copy:{_stream.ptr}")
    return _wrap(np.ascontiguousarray(_memory(x)))


def empty(shape: Any, dtype: Any = np.float64) -> Any:
    return _wrap(np.empty(shape, dtype=dtype))


def zeros(shape: Any, dtype: Any = np.float64) -> Any:
    return _wrap(np.zeros(shape, dtype=dtype))


def full(shape: Any, value: Any, dtype: Any = None) -> Any:
    return _wrap(np.full(shape, value, dtype=dtype))


def empty_like(x: Any) -> Any:
    return _wrap(np.empty_like(_memory(x)))


def zeros_like(x: Any) -> Any:
    return _wrap(np.zeros_like(_memory(x)))


def arange(*args: Any, dtype: Any = None) -> Any:
    return _wrap(np.arange(*args, dtype=dtype))


def ones(shape: Any, dtype: Any = np.float64) -> Any:
    return _wrap(np.ones(shape, dtype=dtype))


bool_, int8, uint8, int16, int32, int64 = np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64
float16, float32, float64 = np.float16, np.float32, np.float64


def abs(x: Any) -> Any:  # noqa: A001 - CuPy's name
    return _wrap(np.abs(_memory(x)))


class random:  # noqa: N801 - CuPy's module name
    _rng = np.random.default_rng(0)

    @staticmethod
    def standard_normal(size: Any = None, dtype: Any = np.float64) -> Any:
        return _wrap(random._rng.standard_normal(size).astype(dtype))


def asnumpy(x: Any) -> np.ndarray:
    if _is_device(x):
        return x.get()
    return np.asarray(x)


# -- cupy.cuda -------------------------------------------------------------------------------------


class Stream:
    _next = 1

    def __init__(self, non_blocking: bool = False, *, _device_id: int | None = None) -> None:
        self.ptr = Stream._next
        Stream._next += 1
        # -1: the null stream, usable under any device (as CuPy's Stream.null)
        self.device_id = _current_device if _device_id is None else _device_id
        self._entered: list[Stream] = []

    def __enter__(self) -> Stream:
        if self.device_id not in (-1, _current_device):  # CuPy's check_stream_device_match
            raise RuntimeError(
                f"The device that the stream is created on ({self.device_id}) does not match "
                f"with the current device ({_current_device})"
            )
        global _stream
        self._entered.append(_stream)
        _stream = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _stream
        _stream = self._entered.pop()

    def synchronize(self) -> None:
        event = Event()
        event.record(self)
        event.synchronize()

    def wait_event(self, event: Any) -> None:
        timeline.append(f"wait:{self.ptr}")
        assert event.done, "the fake runs every stream in order; nothing can be outstanding"


_DEFAULT_STREAM = Stream(_device_id=-1)
_stream = _DEFAULT_STREAM


class _InFlight:
    """An all-reduce the fake could not finish before returning (a peer never came): like a
    kernel still queued on the GPU, it completes when its MPI request does."""

    def __init__(self, request: Any, finish: Any) -> None:
        self.request, self.finish, self.complete = request, finish, False

    def progress(self) -> bool:
        if not self.complete and self.request.Test():
            self.finish()
            self.complete = True
        return self.complete


_in_flight: list[_InFlight] = []


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
        self._waits_for: list[_InFlight] = []

    def record(self, stream: Any = None) -> None:
        timeline.append(f"record:{(stream or _stream).ptr}")
        self._waits_for = [op for op in _in_flight if not op.complete]

    @property
    def done(self) -> bool:
        return all(op.progress() for op in self._waits_for)

    def synchronize(self) -> None:
        while not self.done:
            time.sleep(1e-3)


def _get_elapsed_time(start: Event, stop: Event) -> float:
    return 1.0  # milliseconds; the fake has no clock worth reading


def _get_current_stream() -> Stream:
    return _stream


class _Runtime:
    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - CuPy's name
        return _visible()

    @staticmethod
    def getDevice() -> int:  # noqa: N802
        return _current_device

    @staticmethod
    def getDeviceProperties(device: int) -> dict[str, Any]:  # noqa: N802
        return {"name": b"fake", "multiProcessorCount": 4}

    @staticmethod
    def runtimeGetVersion() -> int:  # noqa: N802
        return 13000


# -- cupy.cuda.nccl: each call done with MPI on views of the raw addresses ----------------------

_NCCL_DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]
_NCCL_DTYPES += [np.float16, np.float32, np.float64]


def _view(ptr: int, count: int, datatype: int) -> np.ndarray:
    dtype = np.dtype(_NCCL_DTYPES[datatype])
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count)


class NcclError(RuntimeError):
    pass


def _nccl_version() -> int:
    return int(os.environ.get("FAKE_NCCL_VERSION", "22304"))


def _check_unique_id(commId: Any) -> None:  # noqa: N803 - CuPy's name
    """What CuPy's signature does with the id before NCCL sees it."""
    if _CUPY_MAJOR >= 14:  # def __init__(self, int ndev, bytes commId, int rank, ...)
        if not isinstance(commId, bytes):
            raise TypeError(
                f"Argument 'commId' has incorrect type (expected bytes, got {type(commId).__name__})"
            )
        if len(commId) != 128:
            raise ValueError(f"commId length {len(commId)} != 128.")
        return
    # CuPy 13: def __init__(self, int ndev, tuple commId, int rank); each item into a C char
    if not isinstance(commId, tuple):
        raise TypeError(
            f"Argument 'commId' has incorrect type (expected tuple, got {type(commId).__name__})"
        )
    assert len(commId) == 128
    for c in commId:
        if not -128 <= int(c) <= 127:  # char is signed on x86-64
            raise OverflowError("value too large to convert to char")


def _get_unique_id() -> Any:
    raw = os.urandom(128)
    if _CUPY_MAJOR >= 14:
        return raw
    return tuple(b - 256 if b > 127 else b for b in raw)


class NcclCommunicator:
    calls: list[str] = []  # what pure_nccl asked NCCL for, in order (the test reads it)

    def __init__(self, ndev: int, commId: Any, rank: int) -> None:  # noqa: N803
        from mpi4py import MPI

        _check_unique_id(commId)
        assert ndev == MPI.COMM_WORLD.Get_size(), "the fake supports COMM_WORLD-wide comms only"
        assert rank == MPI.COMM_WORLD.Get_rank()
        self._comm = MPI.COMM_WORLD.Dup()
        # ncclCommInitRank binds the current device; NCCL refuses two ranks on one GPU
        self.device = _current_device
        host = os.environ.get("MNIFY_HOSTNAME") or MPI.Get_processor_name()
        bus = host + "/" + Device(self.device).pci_bus_id
        buses = self._comm.allgather(bus)
        if buses.count(bus) > 1:
            self._comm.Free()
            raise NcclError(f"ncclInvalidUsage: Duplicate GPU detected: {bus}")
        self._ops = {0: MPI.SUM, 1: MPI.PROD, 2: MPI.MAX, 3: MPI.MIN}
        NcclCommunicator.calls.append(f"init:dev{self.device}")

    def _on_my_device(self) -> None:
        assert _current_device == self.device, (
            f"NCCL call under device {_current_device}, communicator on {self.device}"
        )

    def allReduce(  # noqa: N802
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int
    ) -> None:
        from mpi4py import MPI

        self._on_my_device()
        NcclCommunicator.calls.append(
            f"allReduce:{datatype}:{count}" + (":avg" if op == NCCL_AVG else "")
        )
        send = _view(sendbuf, count, datatype)
        recv = _view(recvbuf, count, datatype)
        if op == NCCL_AVG:
            if _nccl_version() < 21000:
                raise NcclError("ncclInvalidArgument: invalid reduction operation")
            # ncclAvg on floats is a pre-multiplied sum: each input times 1/n in its own dtype
            factor = send.dtype.type(1.0 / self._comm.Get_size())
            send, mpi_op = send * factor, MPI.SUM
        else:
            mpi_op = self._ops[op]
        wide = send.astype(np.float64) if send.dtype == np.float16 else send.copy()
        out = np.empty_like(wide)
        request = self._comm.Iallreduce(wide, out, mpi_op)

        def finish() -> None:
            recv[...] = out.astype(recv.dtype)

        # Finish within FAKE_NCCL_ENQUEUE_S (default: wait for ever, so data is ready for the
        # host-side unpack); past it, return with the reduction "still queued", as NCCL does.
        op_ = _InFlight(request, finish)
        limit = float(os.environ.get("FAKE_NCCL_ENQUEUE_S", "0")) or None
        start = time.monotonic()
        while not op_.progress():
            if limit is not None and time.monotonic() - start > limit:
                _in_flight.append(op_)
                return
            time.sleep(1e-4)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self._on_my_device()
        NcclCommunicator.calls.append(f"bcast:{datatype}:{count}")
        self._comm.Bcast(_view(buff, count, datatype), root=root)

    def allGather(  # noqa: N802
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int
    ) -> None:
        self._on_my_device()
        NcclCommunicator.calls.append(f"allGather:{datatype}:{count}")
        recv = _view(recvbuf, count * self._comm.Get_size(), datatype)
        self._comm.Allgather(_view(sendbuf, count, datatype).copy(), recv)

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        NcclCommunicator.calls.append(f"send:{datatype}:{count}:{peer}")
        data = _view(sendbuf, count, datatype).copy()
        _group_or_wait(self._comm.Isend(data, dest=peer, tag=77), data)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        NcclCommunicator.calls.append(f"recv:{datatype}:{count}:{peer}")
        _group_or_wait(self._comm.Irecv(_view(recvbuf, count, datatype), source=peer, tag=77))

    def destroy(self) -> None:
        NcclCommunicator.calls.append("destroy")
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def abort(self) -> None:
        self.destroy()


_group: list[list[Any]] = []  # open ncclGroupStart: requests (and send copies) to finish


def _group_or_wait(request: Any, *keep: Any) -> None:
    if _group:
        _group[-1].append((request, keep))
    else:
        request.Wait()


def _group_start() -> None:
    _group.append([])


def _group_end() -> None:
    from mpi4py import MPI

    pending = _group.pop()
    MPI.Request.Waitall([request for request, _ in pending])


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


NCCL_AVG = 4
nccl = _module(
    "cupy.cuda.nccl",
    available=True,
    get_version=_nccl_version,
    get_unique_id=_get_unique_id,
    NcclCommunicator=NcclCommunicator,
    NcclError=NcclError,
    NCCL_AVG=NCCL_AVG,
    groupStart=_group_start,
    groupEnd=_group_end,
    **{
        name: i
        for i, name in enumerate(
            ["NCCL_INT8", "NCCL_UINT8", "NCCL_INT32", "NCCL_UINT32", "NCCL_INT64"]
            + ["NCCL_UINT64", "NCCL_FLOAT16", "NCCL_FLOAT32", "NCCL_FLOAT64"]
        )
    },
    NCCL_SUM=0,
    NCCL_PROD=1,
    NCCL_MAX=2,
    NCCL_MIN=3,
)
cuda = _module(
    "cupy.cuda",
    Device=Device,
    Stream=Stream,
    Event=Event,
    get_current_stream=_get_current_stream,
    get_elapsed_time=_get_elapsed_time,
    runtime=_Runtime,
    nccl=nccl,
    CUDARuntimeError=CUDARuntimeError,
)
