"""A stand-in for CuPy + NCCL on CPU ranks, so pure_nccl's logic runs under real MPI in CI.

Not CuPy: "device" arrays are numpy arrays of a subclass whose module is ``cupy`` (so
``is_cupy`` says yes), ``.data.ptr`` is the host address, and ``cupy.cuda.nccl`` performs each
NCCL call with MPI on views made from those raw addresses -- the same pointer/count/dtype calls
pure_nccl makes to the real library. Streams and events are immediate. The test replaces the
CUDA kernels with their numpy twins. Only COMM_WORLD-wide NCCL communicators are supported
(ncclCommInitRank is emulated with a collective Dup of COMM_WORLD).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
import types
from typing import Any

import numpy as np

__version__ = "0.0-fake"


class _Memory:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def copy_from_device_async(self, src: _Memory, nbytes: int, stream: Any = None) -> None:
        ctypes.memmove(self.ptr, src.ptr, nbytes)


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = 0 if device is None else int(device)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def use(self) -> None:
        return None


class ndarray(np.ndarray):  # noqa: N801 - CuPy's name
    @property  # type: ignore[override]
    def data(self) -> _Memory:
        return _Memory(int(self.ctypes.data))

    @property  # type: ignore[override]
    def device(self) -> Device:
        return Device(0)

    def get(self) -> np.ndarray:
        return np.array(self.view(np.ndarray), copy=True)


def _wrap(x: Any) -> ndarray:
    return np.asarray(x).view(ndarray)


def asarray(x: Any, dtype: Any = None) -> ndarray:
    if isinstance(x, ndarray) and dtype is None:
        return x
    return _wrap(np.array(np.asarray(x), dtype=dtype, copy=True))


def array(x: Any, dtype: Any = None, order: str = "K", copy: bool = True) -> ndarray:
    return _wrap(np.array(np.asarray(x), dtype=dtype, order=order, copy=True))


def ascontiguousarray(x: Any) -> ndarray:
    return _wrap(np.ascontiguousarray(x))


def empty(shape: Any, dtype: Any = np.float64) -> ndarray:
    return _wrap(np.empty(shape, dtype=dtype))


def zeros(shape: Any, dtype: Any = np.float64) -> ndarray:
    return _wrap(np.zeros(shape, dtype=dtype))


def full(shape: Any, value: Any, dtype: Any = None) -> ndarray:
    return _wrap(np.full(shape, value, dtype=dtype))


def empty_like(x: Any) -> ndarray:
    return _wrap(np.empty_like(np.asarray(x)))


def zeros_like(x: Any) -> ndarray:
    return _wrap(np.zeros_like(np.asarray(x)))


def arange(*args: Any, dtype: Any = None) -> ndarray:
    return _wrap(np.arange(*args, dtype=dtype))


def ones(shape: Any, dtype: Any = np.float64) -> ndarray:
    return _wrap(np.ones(shape, dtype=dtype))


bool_, int8, uint8, int16, int32, int64 = np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64
float16, float32, float64 = np.float16, np.float32, np.float64


def abs(x: Any) -> ndarray:  # noqa: A001 - CuPy's name
    return _wrap(np.abs(np.asarray(x)))


class random:  # noqa: N801 - CuPy's module name
    _rng = np.random.default_rng(0)

    @staticmethod
    def standard_normal(size: Any = None, dtype: Any = np.float64) -> ndarray:
        return _wrap(random._rng.standard_normal(size).astype(dtype))


def asnumpy(x: Any) -> np.ndarray:
    return np.array(np.asarray(x).view(np.ndarray), copy=True)


# -- cupy.cuda -------------------------------------------------------------------------------------


class Stream:
    _next = 1

    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = Stream._next
        Stream._next += 1

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def synchronize(self) -> None:
        event = Event()
        event.record(self)
        event.synchronize()

    def wait_event(self, event: Any) -> None:
        assert event.done, "the fake runs every stream in order; nothing can be outstanding"


_DEFAULT_STREAM = Stream()


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
    return _DEFAULT_STREAM


class _Runtime:
    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - CuPy's name
        return int(os.environ.get("FAKE_CUPY_DEVICES", "4"))

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


class NcclCommunicator:
    calls: list[str] = []  # what pure_nccl asked NCCL for, in order (the test reads it)

    def __init__(self, ndev: int, commId: tuple[int, ...], rank: int) -> None:  # noqa: N803
        from mpi4py import MPI

        assert len(commId) == 128
        assert ndev == MPI.COMM_WORLD.Get_size(), "the fake supports COMM_WORLD-wide comms only"
        assert rank == MPI.COMM_WORLD.Get_rank()
        self._comm = MPI.COMM_WORLD.Dup()
        self._ops = {0: MPI.SUM, 1: MPI.PROD, 2: MPI.MAX, 3: MPI.MIN}
        NcclCommunicator.calls.append("init")

    def allReduce(  # noqa: N802
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int
    ) -> None:
        NcclCommunicator.calls.append(f"allReduce:{datatype}:{count}")
        send = _view(sendbuf, count, datatype)
        recv = _view(recvbuf, count, datatype)
        wide = send.astype(np.float64) if send.dtype == np.float16 else send.copy()
        out = np.empty_like(wide)
        request = self._comm.Iallreduce(wide, out, self._ops[op])

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
        NcclCommunicator.calls.append(f"bcast:{datatype}:{count}")
        self._comm.Bcast(_view(buff, count, datatype), root=root)

    def allGather(  # noqa: N802
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int
    ) -> None:
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


nccl = _module(
    "cupy.cuda.nccl",
    available=True,
    get_version=lambda: 22304,
    get_unique_id=lambda: tuple(int(b) - 128 for b in os.urandom(128)),
    NcclCommunicator=NcclCommunicator,
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
)
