"""The test suite's stand-in for CuPy 14 + NCCL on CPU: stream order, memory reuse, opaque arrays.

Put ``tests/support/fakecupy`` first on ``sys.path`` (``fakecupy.use()``) and ``import cupy``.

"Device" memory is host memory, but it is used as a GPU uses it, so that code which is only
right by luck on a GPU is wrong here, every time:

- **Streams queue work.** Every operation on a device array (an upload, a copy, arithmetic,
  a kernel, an NCCL call) is queued on the current stream and runs only when the host waits:
  ``Stream.synchronize``, ``Event.synchronize``, a host read (``get``, ``asnumpy``,
  ``float(x)``), or ``Event.done`` (which runs what can run without blocking). A stream that
  waits on an event (``wait_event``) runs the recorded stream up to the event first, when it
  gets there itself. Nothing else orders two streams: reading on one stream what another wrote,
  without an event between them, reads what was there before.
- **A memory pool per stream.** As CuPy's, every allocation comes from the arena of the stream
  current at the time, and a block whose last array is dropped goes back to that arena and is
  handed to the next allocation of that stream at once (best fit). Memory one stream freed
  while another still reads it is overwritten by the next user -- the use-after-free a GPU
  shows only sometimes.
- **Opaque arrays.** ``np.asarray(device_array)`` raises CuPy's ``TypeError``; only ``get``,
  ``asnumpy`` and Python scalars (``float``, ``int``, ``bool``, ``item``) reach the host, each
  after synchronising the current stream (as CuPy's do).
- **Events**: ``get_elapsed_time`` only between two recorded, completed, timed events of one
  device (else CuPy's errors); ``Event.record`` on a stream of another device is refused.
- **Devices**: ``FAKE_CUPY_DEVICES`` visible (default 4); an operation on an array of another
  device than the current one raises CuPy's ``ValueError``; entering a stream of another
  device raises; NCCL calls check the device of their communicator, stream and buffers.
- **NCCL** (``cupy.cuda.nccl``): each call is queued on its stream and done with MPI (on a
  duplicate of COMM_WORLD per communicator) when the stream runs; groups become one queued
  operation. Launching NCCL work on a stream while NCCL work queued on another stream is still
  pending, and the launching stream has no event-order after it, raises: NCCL's kernels block
  until their peers arrive, so NCCL operations on one device must run in one order (the same
  on every rank) -- unordered, they may deadlock.
- **No cuRAND, cuBLAS, cuFFT** (``cupy.random``, ``@``, ``cupy.linalg``): as a CuPy wheel
  installed without the CUDA toolkit's extra libraries, which is what the lent GPU machine has.
- **Kernels**: ``RawModule`` emulates mnify's ``mnify_bucket_copy`` kernels (pack.cu) from
  their raw-pointer tables, read when the launch runs, and refuses ``__restrict__`` pointers
  that alias (the bucket overlapping an array); other kernels are not emulated
  (``mnify_fake_device`` replaces the kernel module with queued numpy twins instead).

``FAKE_CUPY_FREE_CHECK=0`` lets work on memory freed to another stream's pool run (it then
reads what the new owner wrote) instead of refusing it. Counters tests read: ``TRANSFERS`` (host<->device copies), ``HOST_SYNCS`` (times the host
waited on a stream or event), ``timeline`` (``copy:<stream>``, ``record:<stream>``,
``wait:<stream>``, in the order they were queued). CuPy 14's NCCL id is ``bytes``;
``FAKE_CUPY_VERSION=13.6.0`` gives CuPy 13's tuple. ``FAKE_NCCL_VERSION``: NCCL's version code.
"""

from __future__ import annotations

import bisect
import ctypes
import operator
import os
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

__version__ = os.environ.get("FAKE_CUPY_VERSION", "14.2.0")
_CUPY_MAJOR = int(__version__.split(".")[0])
STRICT = True
# refuse work that runs on memory freed to another stream's pool meanwhile (0: let it run and
# read whatever the new owner wrote -- the wrong result a GPU gives)
_FREE_CHECK = os.environ.get("FAKE_CUPY_FREE_CHECK", "1") != "0"

# what tests read
TRANSFERS = {"download": 0, "upload": 0}
HOST_SYNCS = {"count": 0}
timeline: list[str] = []


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

    def synchronize(self) -> None:
        for s in list(_streams.values()):
            if s.device_id in (-1, self.id):
                s.synchronize()

    @property
    def pci_bus_id(self) -> str:
        return f"0000:{int(os.environ.get('FAKE_CUPY_FIRST_BUS', '0')) + self.id:02x}:00.0"

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


# -- streams and events ------------------------------------------------------------------------


class _Op:
    """One queued operation: ``run(block)`` returns True once it is complete.

    ``touches``: the device memory it reads or writes (arrays or addresses). When it runs, a
    buffer among them that went back to another stream's pool after it was queued -- with
    that stream not ordered after it -- is refused: that stream's next allocation may have it.
    """

    stream: Stream | None = None
    pos = 0
    touches: list[tuple[int, int]] = []

    def __init__(self, fn: Callable[[], None], touches: Any = ()) -> None:
        self.fn = fn
        self.touches = _queued_touches(touches)

    def run(self, block: bool) -> bool:
        self.fn()
        return True

    def check(self) -> None:
        for start, freed_before in self.touches:
            frees = _frees.get(start, [])
            if len(frees) <= freed_before:
                continue
            free_stream, clock = frees[freed_before]
            mine = self.stream.ptr if self.stream is not None else -1
            if free_stream != mine and clock.get(mine, 0) < self.pos:
                raise RuntimeError(
                    f"stand-in: work queued on stream {mine:#x} uses device memory at "
                    f"{start:#x} that was freed to stream {free_stream:#x}'s pool before the "
                    "work ran, with no event ordering them (that stream's next allocation "
                    "may take it at once: use after free)"
                )


# every stream ever made, kept: as on a GPU, work queued on a stream the program dropped is
# still there (and still counts as pending NCCL work)
_streams: dict[int, Stream] = {}


class Stream:
    _next = 0x1000

    def __init__(
        self, null: bool = False, non_blocking: bool = False, ptds: bool = False, *,
        _device_id: int | None = None,
    ) -> None:  # fmt: skip
        self.ptr = 0 if null else Stream._next
        if not null:
            Stream._next += 0x10
        # -1: the null stream, usable under any device (as CuPy's Stream.null)
        self.device_id = _current_device if _device_id is None else _device_id
        self._entered: list[Stream] = []
        self._queue: list[_Op | None] = []
        self._done = 0
        # what this stream is known to run after: stream ptr -> ops of it (vector clock)
        self._clock: dict[int, int] = {}
        self._nccl_pending: list[tuple[int, str]] = []  # (position, what) of NCCL ops
        _streams[self.ptr] = self

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

    def use(self) -> Stream:
        global _stream
        _stream = self
        return self

    def _enqueue(self, op: _Op) -> int:
        self._queue.append(op)
        op.stream, op.pos = self, len(self._queue)
        return op.pos

    def _run(self, upto: int, block: bool) -> bool:
        """Run the queued work before position ``upto``; False if it cannot finish now."""
        while self._done < upto:
            op = self._queue[self._done]
            if op is not None and op.touches and _FREE_CHECK:
                op.check()
            if op is not None and not op.run(block):
                return False
            self._queue[self._done] = None  # let what it held go
            self._done += 1
        self._nccl_pending = [(p, w) for p, w in self._nccl_pending if p >= self._done]
        return True

    def synchronize(self) -> None:
        HOST_SYNCS["count"] += 1
        self._run(len(self._queue), block=True)

    @property
    def done(self) -> bool:
        return self._run(len(self._queue), block=False)

    def query(self) -> bool:
        return self.done

    def record(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        timeline.append(f"wait:{self.ptr}")
        source = event._stream
        if source is None or source is self:
            return
        pos = event._pos
        for ptr, n in event._clock.items():
            self._clock[ptr] = max(self._clock.get(ptr, 0), n)
        self._enqueue(_Wait(source, pos))

    def __repr__(self) -> str:
        return f"<fake Stream {self.ptr:#x} (device {self.device_id})>"


class _Wait(_Op):
    def __init__(self, source: Stream, upto: int) -> None:
        self.source, self.upto = source, upto

    def run(self, block: bool) -> bool:
        return self.source._run(self.upto, block)


_DEFAULT_STREAM = Stream(null=True, _device_id=-1)
Stream.null = _DEFAULT_STREAM  # type: ignore[attr-defined]
_stream = _DEFAULT_STREAM


def _get_current_stream() -> Stream:
    return _stream


def _enqueue(fn: Callable[[], None], stream: Stream | None = None, touches: Any = ()) -> None:
    """Queue ``fn`` on ``stream`` (default: the current one) -- the stand-in's kernel launch;
    ``touches``: the device arrays or addresses it uses (see :class:`_Op`)."""
    (stream or _stream)._enqueue(_Op(fn, touches))


class Event:
    def __init__(
        self, block: bool = False, disable_timing: bool = False, interprocess: bool = False
    ) -> None:
        self.device_id = _current_device
        self.disable_timing = disable_timing
        self._stream: Stream | None = None
        self._pos = 0
        self._clock: dict[int, int] = {}
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or _stream
        on = _current_device if stream.device_id == -1 else stream.device_id
        if on != self.device_id:
            raise CUDARuntimeError(
                f"cudaErrorInvalidResourceHandle: an event of device {self.device_id} recorded "
                f"on a stream of device {on}"
            )
        timeline.append(f"record:{stream.ptr}")
        self._time = None

        def stamp() -> None:
            self._time = time.perf_counter()

        self._stream = stream
        self._pos = stream._enqueue(_Op(stamp))
        self._clock = dict(stream._clock)
        self._clock[stream.ptr] = self._pos

    @property
    def done(self) -> bool:
        return self._stream is None or self._stream._run(self._pos, block=False)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        HOST_SYNCS["count"] += 1
        if self._stream is not None:
            self._stream._run(self._pos, block=True)


def _get_elapsed_time(start: Event, stop: Event) -> float:
    for e in (start, stop):
        if e.disable_timing:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: event without timing")
        if e._stream is None:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: event never recorded")
        if e._time is None:
            raise CUDARuntimeError("cudaErrorNotReady: event not completed")
    if start.device_id != stop.device_id:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle: events of two devices")
    assert start._time is not None and stop._time is not None
    return (stop._time - start._time) * 1e3


# -- memory: one pool per (device, stream) -------------------------------------------------------

_ROUND = 512
_all_starts: list[int] = []  # every buffer ever made: start -> (end, device)
_all_spans: dict[int, tuple[int, int]] = {}


class _Pool:
    def __init__(self) -> None:
        self.free: dict[int, list[np.ndarray]] = {}

    def take(self, nbytes: int) -> np.ndarray | None:
        sizes = sorted(s for s, bufs in self.free.items() if s >= nbytes and bufs)
        return self.free[sizes[0]].pop() if sizes else None

    def give(self, buf: np.ndarray) -> None:
        self.free.setdefault(buf.nbytes, []).append(buf)


_pools: dict[tuple[int, int], _Pool] = {}
# buffer start -> every time it went back to a pool: (the pool's stream, that stream's clock)
_frees: dict[int, list[tuple[int, dict[int, int]]]] = {}


def _start_of(ptr: int) -> int | None:
    i = bisect.bisect_right(_all_starts, ptr) - 1
    if i < 0:
        return None
    start = _all_starts[i]
    return start if ptr < _all_spans[start][0] else None


def _queued_touches(touches: Any) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    for t in touches:
        if isinstance(t, ndarray):
            t = t._mem
        ptr = int(t.ctypes.data) if isinstance(t, np.ndarray) else int(t)
        start = _start_of(ptr)
        if start is not None:
            found.append((start, len(_frees.get(start, ()))))
    return found


class _Block:
    """One allocation; when its last array goes, its memory returns to its stream's pool."""

    __slots__ = ("buf", "pool", "device", "stream_ptr")

    def __init__(self, nbytes: int) -> None:
        size = max(_ROUND, -(-nbytes // _ROUND) * _ROUND)
        self.device = _current_device
        self.stream_ptr = _stream.ptr
        self.pool = _pools.setdefault((self.device, self.stream_ptr), _Pool())
        buf = self.pool.take(size)
        if buf is None:
            buf = np.empty(size, dtype=np.uint8)
            start = int(buf.ctypes.data)
            bisect.insort(_all_starts, start)
            _all_spans[start] = (start + size, self.device)
        self.buf = buf

    def __del__(self) -> None:
        try:
            stream = _streams.get(self.stream_ptr)
            clock = dict(stream._clock) if stream is not None else {}
            if stream is not None:
                clock[stream.ptr] = len(stream._queue)
            _frees.setdefault(int(self.buf.ctypes.data), []).append((self.stream_ptr, clock))
            self.pool.give(self.buf)
        except Exception:  # interpreter shutdown
            pass


def device_of_pointer(ptr: int) -> int | None:
    """The device whose memory holds address ``ptr`` (None: not device memory)."""
    start = _start_of(ptr)
    return None if start is None else _all_spans[start][1]


def _raw(ptr: int, count: int, dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    if count == 0:
        return np.empty(0, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count)


class _Memory:
    """``ndarray.data``: a device pointer."""

    def __init__(self, ptr: int, owner: Any = None) -> None:
        self.ptr = ptr
        self._owner = owner

    def copy_from_device_async(self, src: _Memory, nbytes: int, stream: Any = None) -> None:
        dst_ptr, src_ptr = self.ptr, src.ptr
        _enqueue(lambda: ctypes.memmove(dst_ptr, src_ptr, nbytes), stream, (dst_ptr, src_ptr))


# -- arrays --------------------------------------------------------------------------------------

_IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. "
    "Please use `.get()` to construct a NumPy array explicitly."
)


def _new(shape: Any, dtype: Any) -> ndarray:
    """An uninitialised array from the current stream's pool on the current device."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in (shape if isinstance(shape, tuple | list) else (shape,)))
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    block = _Block(nbytes)
    mem = block.buf[:nbytes].view(dtype).reshape(shape)
    return ndarray._make(block, mem)


def _check_device(*arrays: Any) -> None:
    for a in arrays:
        if isinstance(a, ndarray) and a._block.device != _current_device:
            raise ValueError(
                f"Array device must be same as the current device: array device = "
                f"{a._block.device} while current = {_current_device}"
            )


def _flatten_args(args: Any) -> list[ndarray]:
    found: list[ndarray] = []
    for a in args:
        if isinstance(a, ndarray):
            found.append(a)
        elif isinstance(a, list | tuple):
            found += _flatten_args(a)
    return found


def _mem_of(x: Any) -> Any:
    if isinstance(x, ndarray):
        return x._mem
    if isinstance(x, list):
        return [_mem_of(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_mem_of(v) for v in x)
    return x


def _shadow_of(x: Any) -> Any:
    """Stand-ins with an array's shape and dtype and no memory (to learn a result's shape)."""
    if isinstance(x, ndarray):
        if x.size == 0:
            return np.empty(x.shape, x.dtype)
        return np.lib.stride_tricks.as_strided(np.zeros(1, x.dtype), x.shape, (0,) * x.ndim)
    if isinstance(x, list):
        return [_shadow_of(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_shadow_of(v) for v in x)
    return x


def _op(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ndarray:
    """A new device array: ``fn`` of the arguments' memory, queued on the current stream."""
    inputs = _flatten_args(list(args) + list(kwargs.values()))
    _check_device(*inputs)
    with np.errstate(all="ignore"):
        probe = np.asarray(fn(*_shadow_of(args), **_shadow_of(kwargs)))
    out = _new(probe.shape, probe.dtype)
    target = out._mem
    # the queued work holds the memory, not the arrays: as on a GPU, a block whose arrays are
    # gone returns to its pool while work queued on another stream may still read it
    mems, kwmems = _mem_of(args), _mem_of(kwargs)

    def run() -> None:
        with np.errstate(all="ignore"):
            target[...] = fn(*mems, **kwmems)

    _enqueue(run, touches=[*inputs, out])
    return out


def _in_place(fn: Callable[..., None], *args: Any) -> None:
    arrays = _flatten_args(args)
    _check_device(*arrays)
    mems = _mem_of(args)

    def run() -> None:
        with np.errstate(all="ignore"):
            fn(*mems)

    _enqueue(run, touches=arrays)


def _host_read(x: ndarray, stream: Stream | None = None) -> np.ndarray:
    (stream or _stream).synchronize()
    return x._mem.copy()


def _binary(op: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[..., Any]:
    def method(self: ndarray, other: Any) -> Any:
        if isinstance(other, np.ndarray) and other.shape != ():
            return NotImplemented
        return _op(op, other, self) if reflected else _op(op, self, other)

    return method


def _inplace(op: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def method(self: ndarray, other: Any) -> ndarray:
        _in_place(lambda a, b: op(a, b), self, other)
        return self

    return method


def _missing_library(name: str) -> Any:
    raise ImportError(f"cupy.{name} needs {_TOOLKIT_LIBRARIES[name]}, not in this CuPy install")


# what a CuPy wheel without the CUDA toolkit's extra libraries cannot do (the lent GPU machine's)
_TOOLKIT_LIBRARIES = {"random": "cuRAND", "linalg": "cuBLAS/cuSOLVER", "fft": "cuFFT"}


def _no_cublas(*args: Any) -> Any:
    raise RuntimeError("matmul needs cuBLAS (libcublas), not in this CuPy install")


class ndarray:  # noqa: N801 - CuPy's name
    """A device array numpy cannot read (see the module doc)."""

    __module__ = "cupy"

    __array_priority__ = 100
    __hash__ = None  # type: ignore[assignment]

    _block: _Block
    _mem: np.ndarray

    def __init__(self, shape: Any, dtype: Any = float) -> None:
        made = _new(shape, dtype)
        self._block, self._mem = made._block, made._mem

    @classmethod
    def _make(cls, block: _Block, mem: np.ndarray) -> ndarray:
        a = cls.__new__(cls)
        a._block, a._mem = block, mem
        return a

    shape = property(lambda self: self._mem.shape)
    dtype = property(lambda self: self._mem.dtype)
    size = property(lambda self: self._mem.size)
    ndim = property(lambda self: self._mem.ndim)
    nbytes = property(lambda self: self._mem.nbytes)
    itemsize = property(lambda self: self._mem.itemsize)
    strides = property(lambda self: self._mem.strides)
    flags = property(lambda self: self._mem.flags)

    @property
    def data(self) -> _Memory:
        return _Memory(int(self._mem.ctypes.data), self)

    @property
    def device(self) -> Device:
        return Device(self._block.device)

    # host transfers
    def get(self, stream: Any = None, order: str = "C", out: Any = None) -> np.ndarray:
        TRANSFERS["download"] += 1
        return _host_read(self, stream)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(arr)}")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        TRANSFERS["upload"] += 1
        snapshot, target = arr.astype(self.dtype, copy=True), self._mem
        _enqueue(lambda: target.__setitem__(Ellipsis, snapshot), stream, [self])

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(_IMPLICIT)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method != "__call__" or any(isinstance(x, np.ndarray) and x.shape != () for x in inputs):
            raise TypeError(_IMPLICIT)
        out = kwargs.pop("out", None)
        if out is not None:
            (target,) = out
            _in_place(lambda t, *m: ufunc(*m, out=t, **kwargs), target, *inputs)
            return target
        return _op(lambda *m: ufunc(*m, **kwargs), *inputs)

    def __float__(self) -> float:
        return float(_host_read(self))

    def __int__(self) -> int:
        return int(_host_read(self))

    def __bool__(self) -> bool:
        return bool(_host_read(self))

    def __index__(self) -> int:
        return operator.index(_host_read(self).item())

    def item(self) -> Any:
        return _host_read(self).item()

    def tolist(self) -> Any:
        return _host_read(self).tolist()

    def __len__(self) -> int:
        return len(self._mem)

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"array({_host_read(self).tolist()!r}, dtype={self.dtype}) (fake CuPy)"

    # views and copies
    def __getitem__(self, key: Any) -> ndarray:
        _check_device(*_flatten_args([key]))
        mkey = _mem_of(key)
        view = self._mem[mkey]
        if not isinstance(view, np.ndarray):  # an element: a 0-d view, as CuPy's
            view = self._mem[(mkey if isinstance(mkey, tuple) else (mkey,)) + (Ellipsis,)]
        if view.size == 0 or np.may_share_memory(view, self._block.buf):
            return ndarray._make(self._block, view)
        return _op(lambda a: a[mkey], self)  # advanced indexing: a copy, in stream order

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, np.ndarray) and value.shape != ():
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        _check_device(self, *_flatten_args([key, value]))
        mkey, mval, target = _mem_of(key), _mem_of(value), self._mem

        def run() -> None:
            target[mkey] = mval

        _enqueue(run, touches=[self, *_flatten_args([key, value])])

    def fill(self, value: Any) -> None:
        _in_place(lambda a: a.fill(value), self)

    def copy(self, order: str = "C") -> ndarray:
        return _op(lambda a: np.array(a, order=order, copy=True), self)

    def astype(self, dtype: Any, copy: bool = True, **kwargs: Any) -> ndarray:
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return _op(lambda a: a.astype(dtype), self)

    def view(self, dtype: Any = None) -> ndarray:
        return ndarray._make(
            self._block, self._mem.view() if dtype is None else self._mem.view(dtype)
        )

    def reshape(self, *shape: Any, order: str = "C") -> ndarray:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        view = self._mem.view()
        try:
            view.shape = np.empty(self.shape, dtype=np.uint8).reshape(shape).shape
        except AttributeError:  # needs a copy
            return _op(lambda a: a.reshape(shape), self)
        return ndarray._make(self._block, view)

    def ravel(self) -> ndarray:
        return self.reshape(-1)

    def flatten(self) -> ndarray:
        return self.copy().reshape(-1)

    def transpose(self, *axes: Any) -> ndarray:
        return ndarray._make(self._block, self._mem.transpose(*axes))

    T = property(lambda self: self.transpose())

    def squeeze(self, axis: Any = None) -> ndarray:
        return ndarray._make(self._block, self._mem.squeeze(axis))

    def __getattr__(self, name: str) -> Any:
        # reductions and other methods that make a new array: queued like everything else
        if name in _METHODS:
            return lambda *a, **k: _op(lambda m, *aa: getattr(m, name)(*aa, **k), self, *a)
        raise AttributeError(f"fake cupy.ndarray has no attribute {name!r}")

    __add__, __radd__ = _binary(operator.add), _binary(operator.add, True)
    __sub__, __rsub__ = _binary(operator.sub), _binary(operator.sub, True)
    __mul__, __rmul__ = _binary(operator.mul), _binary(operator.mul, True)
    __truediv__, __rtruediv__ = _binary(operator.truediv), _binary(operator.truediv, True)
    __floordiv__ = _binary(operator.floordiv)
    __mod__ = _binary(operator.mod)
    __pow__, __rpow__ = _binary(operator.pow), _binary(operator.pow, True)
    __matmul__ = __rmatmul__ = _no_cublas
    __and__, __or__, __xor__ = _binary(operator.and_), _binary(operator.or_), _binary(operator.xor)
    __eq__ = _binary(operator.eq)  # type: ignore[assignment]
    __ne__ = _binary(operator.ne)  # type: ignore[assignment]
    __lt__, __le__ = _binary(operator.lt), _binary(operator.le)
    __gt__, __ge__ = _binary(operator.gt), _binary(operator.ge)
    __iadd__, __isub__ = _inplace(operator.iadd), _inplace(operator.isub)
    __imul__, __itruediv__ = _inplace(operator.imul), _inplace(operator.itruediv)

    def __neg__(self) -> ndarray:
        return _op(operator.neg, self)

    def __abs__(self) -> ndarray:
        return _op(np.abs, self)


_METHODS = frozenset(
    "sum max min mean prod all any argmax argmin std var cumsum clip round nonzero".split()
)


# -- module functions ----------------------------------------------------------------------------


def _upload(x: Any, dtype: Any = None, order: str = "K") -> ndarray:
    if isinstance(x, ndarray):
        _check_device(x)
        return _op(lambda a: np.array(a, dtype=dtype, order=order, copy=True), x)
    host = np.array(x, dtype=dtype, order="C", copy=True)
    TRANSFERS["upload"] += 1
    out = _new(host.shape, host.dtype)
    target = out._mem
    _enqueue(lambda: target.__setitem__(Ellipsis, host), touches=[out])
    return out


def asarray(x: Any, dtype: Any = None, order: Any = None) -> ndarray:
    if isinstance(x, ndarray) and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    return _upload(x, dtype)


def array(x: Any, dtype: Any = None, copy: bool = True, order: str = "K", **kw: Any) -> ndarray:
    if isinstance(x, ndarray) and not copy and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    return _upload(x, dtype, order)


def ascontiguousarray(x: Any, dtype: Any = None) -> ndarray:
    if not isinstance(x, ndarray):
        return _upload(x, dtype, "C")
    if x.flags.c_contiguous and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    timeline.append(f"copy:{_stream.ptr}")
    return _op(lambda a: np.ascontiguousarray(a, dtype=dtype), x)


def empty(shape: Any, dtype: Any = np.float64, order: str = "C") -> ndarray:
    return _new(shape, dtype)


def _filled(shape: Any, value: Any, dtype: Any) -> ndarray:
    out = _new(shape, dtype)
    target = out._mem
    _enqueue(lambda: target.fill(value), touches=[out])
    return out


def zeros(shape: Any, dtype: Any = np.float64, order: str = "C") -> ndarray:
    return _filled(shape, 0, dtype)


def ones(shape: Any, dtype: Any = np.float64, order: str = "C") -> ndarray:
    return _filled(shape, 1, dtype)


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    if dtype is None:
        dtype = np.array(fill_value).dtype
    return _filled(shape, fill_value, dtype)


def empty_like(x: Any, dtype: Any = None, shape: Any = None) -> ndarray:
    return _new(x.shape if shape is None else shape, x.dtype if dtype is None else dtype)


def zeros_like(x: Any, dtype: Any = None) -> ndarray:
    return _filled(x.shape, 0, x.dtype if dtype is None else dtype)


def ones_like(x: Any, dtype: Any = None) -> ndarray:
    return _filled(x.shape, 1, x.dtype if dtype is None else dtype)


def full_like(x: Any, fill_value: Any, dtype: Any = None) -> ndarray:
    return _filled(x.shape, fill_value, x.dtype if dtype is None else dtype)


def arange(*args: Any, dtype: Any = None) -> ndarray:
    return _upload(np.arange(*args, dtype=dtype))


def asnumpy(x: Any, stream: Any = None) -> np.ndarray:
    if isinstance(x, ndarray):
        return x.get(stream)
    return np.asarray(x)


def get_array_module(*args: Any) -> Any:
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


bool_, int8, uint8, int16, int32, int64 = np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64
uint32, uint64 = np.uint32, np.uint64
float16, float32, float64 = np.float16, np.float32, np.float64
dtype = np.dtype
newaxis = None
nan, inf, pi = np.nan, np.inf, np.pi

# numpy functions of device arrays, queued like everything else (a result is a device array)
_FUNCTIONS = frozenset(
    "abs sqrt exp log maximum minimum where stack concatenate isnan isfinite sum max min mean "
    "multiply add subtract divide clip sign allclose array_equal all any".split()
)


def __getattr__(name: str) -> Any:
    if name in _TOOLKIT_LIBRARIES:
        _missing_library(name)
    if name in _FUNCTIONS:
        fn = getattr(np, name)

        def call(*a: Any, out: Any = None, **k: Any) -> Any:
            if out is None:
                return _op(lambda *m: fn(*m, **k), *a)
            _in_place(lambda o, *m: fn(*m, out=o, **k), out, *a)
            return out

        return call
    raise AttributeError(f"module 'cupy' (fake, strict) has no attribute {name!r}")


# -- kernels -------------------------------------------------------------------------------------

_CTYPES = {"mn_half": np.float16, "float": np.float32, "double": np.float64}


class _BucketCopy:
    """``mnify_bucket_copy<ArrT, BufT, ToBuffer>`` of pack.cu, from its tables at run time."""

    def __init__(self, name: str) -> None:
        inner = name[name.index("<") + 1 : name.rindex(">")]
        arr_t, buf_t, flag = (p.strip() for p in inner.split(","))
        self.arr_dtype, self.buf_dtype = np.dtype(_CTYPES[arr_t]), np.dtype(_CTYPES[buf_t])
        self.to_buffer = flag == "true"
        wide = np.float64 in (self.arr_dtype, self.buf_dtype)
        self.work = np.dtype(np.float64 if wide else np.float32)

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0, **kw: Any) -> None:
        ptrs, offsets, sizes, tile_array, tile_begin, n_tiles, tile_elems, buffer, scale = args
        _check_device(ptrs, offsets, sizes, tile_array, tile_begin, buffer)
        if buffer.dtype != self.buf_dtype:
            raise TypeError(f"bucket of {buffer.dtype} given to a {self.buf_dtype} kernel")
        tables = [t._mem for t in (ptrs, offsets, sizes, tile_array, tile_begin)]
        buf, n, tile, s = buffer._mem, int(n_tiles), int(tile_elems), float(scale)
        buf_lo = int(buf.ctypes.data)
        buf_hi = buf_lo + buf.nbytes
        work = self.work

        def run() -> None:
            p, off, size, t_arr, t_begin = (t.copy() for t in tables)
            for a in range(len(p)):
                lo, hi = int(p[a]), int(p[a]) + int(size[a]) * self.arr_dtype.itemsize
                if int(size[a]) and lo < buf_hi and buf_lo < hi:
                    raise RuntimeError(
                        "mnify_bucket_copy: aliased __restrict__ pointers (array "
                        f"{a} at {lo:#x}..{hi:#x} overlaps the bucket {buf_lo:#x}..{buf_hi:#x})"
                    )
            for t in range(n):
                a = int(t_arr[t])
                begin = int(t_begin[t])
                end = min(begin + tile, int(size[a]))
                arr = _raw(int(p[a]), int(size[a]), self.arr_dtype)[begin:end]
                view = buf[int(off[a]) + begin : int(off[a]) + end]
                src, dst = (arr, view) if self.to_buffer else (view, arr)
                dst[...] = (src.astype(work) * work.type(s)).astype(dst.dtype)

        _enqueue(
            run, touches=[*(t for t in (ptrs, offsets, sizes, tile_array, tile_begin)), buffer]
        )


class _Spin:
    """bench/spin.cu's ``mnify_bench_spin(cycles, sink)``: a wait of ``cycles`` ns here."""

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0, **kw: Any) -> None:
        cycles, sink = int(args[0]), args[1]
        _check_device(sink)
        _enqueue(lambda: time.sleep(min(cycles * 1e-9, 0.05)), touches=[sink])


class RawKernel(_Spin):
    def __init__(self, code: str, name: str, **kwargs: Any) -> None:
        if name != "mnify_bench_spin":
            raise NotImplementedError(f"the CuPy stand-in does not emulate kernel {name!r}")


class RawModule:
    def __init__(self, code: str = "", name_expressions: Any = (), **kwargs: Any) -> None:
        self.code, self.device = code, _current_device

    def get_function(self, name: str) -> Any:
        if name.startswith("mnify_bucket_copy<"):
            return _BucketCopy(name)
        raise NotImplementedError(f"the CuPy stand-in does not emulate kernel {name!r}")


# -- cupy.cuda.runtime ---------------------------------------------------------------------------


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

    @staticmethod
    def deviceSynchronize() -> None:  # noqa: N802
        Device().synchronize()


# -- cupy.cuda.nccl: each call queued on its stream, done with MPI when the stream runs ---------

_NCCL_DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]
_NCCL_DTYPES += [np.float16, np.float32, np.float64]
NCCL_AVG = 4


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
    if not isinstance(commId, tuple):  # CuPy 13: tuple commId; each item into a C char
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


class _Part:
    """One NCCL operation of a launch: ``post`` (reads its input) -> MPI request; ``finish``."""

    def __init__(self, post: Callable[[], Any], finish: Callable[[], None] | None = None) -> None:
        self.post, self.finish = post, finish
        self.buffers: list[int] = []  # device addresses it reads or writes


class _NcclLaunch(_Op):
    """A queued NCCL launch (one call, or a group): posts its MPI requests when its stream
    reaches it, completes when they do."""

    def __init__(self, comm: NcclCommunicator, stream: Stream, parts: list[_Part]) -> None:
        self.comm, self.stream, self.parts = comm, stream, parts
        self.position = 0  # in its stream's queue, once queued
        self.requests: list[Any] | None = None
        self.aborted = False

    def run(self, block: bool) -> bool:
        from mpi4py import MPI

        if self.aborted:
            return True
        if self.requests is None:
            self.requests = [part.post() for part in self.parts]
        while not MPI.Request.Testall(self.requests):
            if not block:
                return False
            time.sleep(2e-4)
        for part in self.parts:
            if part.finish is not None:
                part.finish()
        self.comm._pending.discard(self)
        return True


_group: list[list[tuple[NcclCommunicator, Stream, _Part, str]]] = []


def _stream_of(ptr: int) -> Stream:
    stream = _streams.get(int(ptr))
    if stream is None:
        raise NcclError(f"ncclInvalidArgument: no stream {ptr:#x}")
    return stream


def _launch(comm: NcclCommunicator, stream: Stream, parts: list[_Part], what: str) -> None:
    """Queue NCCL work on ``stream``, refusing it while NCCL work on another stream is pending
    and ``stream`` is not ordered after it."""
    for other in list(_streams.values()):
        if other is stream:
            continue
        for pos, pending in other._nccl_pending:
            if pos > other._done and stream._clock.get(other.ptr, 0) < pos:
                raise NcclError(
                    f"ncclInvalidUsage (stand-in): {what} queued on stream {stream.ptr:#x} while "
                    f"{pending} is still queued on stream {other.ptr:#x}, with no event "
                    "ordering them: NCCL operations of one device must run in one order"
                )
    launch = _NcclLaunch(comm, stream, parts)
    launch.touches = _queued_touches([p for part in parts for p in part.buffers])
    comm._pending.add(launch)
    launch.position = pos = stream._enqueue(launch)
    stream._nccl_pending.append((pos, what))


def _check_buffer(comm: NcclCommunicator, ptr: int, what: str) -> None:
    device = device_of_pointer(int(ptr))
    if device != comm.device:
        raise NcclError(
            f"ncclInvalidArgument: {what} {ptr:#x} is on device {device}, the communicator "
            f"on device {comm.device}"
        )


class NcclCommunicator:
    calls: list[str] = []  # what pure_nccl asked NCCL for, in order (tests read it)
    _count = 0

    def __init__(self, ndev: int, commId: Any, rank: int) -> None:  # noqa: N803
        from mpi4py import MPI

        _check_unique_id(commId)
        assert ndev == MPI.COMM_WORLD.Get_size(), "the fake supports COMM_WORLD-wide comms only"
        assert rank == MPI.COMM_WORLD.Get_rank()
        self._comm: Any = MPI.COMM_WORLD.Dup()
        self.device = _current_device  # ncclCommInitRank binds the current device
        NcclCommunicator._count += 1
        self.name = f"communicator #{NcclCommunicator._count}"
        self._pending: set[_NcclLaunch] = set()
        from mnify import environment  # standard library only: no cycle with the runtime

        host = environment.HOSTNAME.read() or MPI.Get_processor_name()
        bus = host + "/" + Device(self.device).pci_bus_id
        buses = self._comm.allgather(bus)
        if buses.count(bus) > 1:
            self._comm.Free()
            raise NcclError(f"ncclInvalidUsage: Duplicate GPU detected: {bus}")
        self._ops = {0: MPI.SUM, 1: MPI.PROD, 2: MPI.MAX, 3: MPI.MIN}
        NcclCommunicator.calls.append(f"init:dev{self.device}")

    def _checked(self, stream_ptr: int, *buffers: tuple[int, int, str]) -> Stream:
        if self._comm is None:
            raise NcclError("ncclInvalidUsage: the communicator was destroyed")
        if _current_device != self.device:
            raise AssertionError(
                f"NCCL call under device {_current_device}, communicator on {self.device}"
            )
        stream = _stream_of(stream_ptr)
        if stream.device_id not in (-1, self.device):
            raise NcclError(
                f"ncclInvalidArgument: stream of device {stream.device_id}, communicator on "
                f"{self.device}"
            )
        for ptr, count, what in buffers:
            if count:
                _check_buffer(self, ptr, what)
        return stream

    def _submit(self, stream: Stream, part: _Part, what: str, *buffers: int) -> None:
        part.buffers = [int(b) for b in buffers]
        if _group:
            _group[-1].append((self, stream, part, what))
        else:
            _launch(self, stream, [part], f"{self.name} {what}")

    def allReduce(  # noqa: N802
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int
    ) -> None:
        from mpi4py import MPI

        s = self._checked(stream, (sendbuf, count, "sendbuf"), (recvbuf, count, "recvbuf"))
        avg = op == NCCL_AVG
        NcclCommunicator.calls.append(f"allReduce:{datatype}:{count}" + (":avg" if avg else ""))
        if avg and _nccl_version() < 21000:
            raise NcclError("ncclInvalidArgument: invalid reduction operation")
        dtype = np.dtype(_NCCL_DTYPES[datatype])
        comm, mpi_op = self._comm, (MPI.SUM if avg else self._ops[op])
        out: list[np.ndarray] = []

        def post() -> Any:
            send = _raw(sendbuf, count, dtype).copy()
            if avg:  # ncclAvg on floats: each input times 1/n in its own dtype, then summed
                send = send * dtype.type(1.0 / comm.Get_size())
            wide = send.astype(np.float64) if dtype == np.float16 else send
            out[:] = [np.empty_like(wide), wide]  # both alive until the request completes
            return comm.Iallreduce(wide, out[0], mpi_op)

        def finish() -> None:
            _raw(recvbuf, count, dtype)[...] = out[0].astype(dtype)
            out.clear()

        self._submit(s, _Part(post, finish), f"allReduce of {count}", sendbuf, recvbuf)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        s = self._checked(stream, (buff, count, "buff"))
        NcclCommunicator.calls.append(f"bcast:{datatype}:{count}")
        comm, dtype = self._comm, _NCCL_DTYPES[datatype]
        post = lambda: comm.Ibcast(_raw(buff, count, dtype), root=root)  # noqa: E731
        self._submit(s, _Part(post), "bcast", buff)

    def allGather(  # noqa: N802
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int
    ) -> None:
        n = self._comm.Get_size() if self._comm is not None else 0
        s = self._checked(stream, (sendbuf, count, "sendbuf"), (recvbuf, count * n, "recvbuf"))
        NcclCommunicator.calls.append(f"allGather:{datatype}:{count}")
        comm, dtype = self._comm, _NCCL_DTYPES[datatype]

        keep: list[np.ndarray] = []

        def post() -> Any:
            keep.append(_raw(sendbuf, count, dtype).copy())
            return comm.Iallgather(keep[0], _raw(recvbuf, count * n, dtype))

        self._submit(s, _Part(post, keep.clear), "allGather", sendbuf, recvbuf)

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        s = self._checked(stream, (sendbuf, count, "sendbuf"))
        NcclCommunicator.calls.append(f"send:{datatype}:{count}:{peer}")
        comm, dtype = self._comm, _NCCL_DTYPES[datatype]
        keep: list[np.ndarray] = []

        def post() -> Any:
            keep.append(_raw(sendbuf, count, dtype).copy())
            return comm.Isend(keep[0], dest=peer, tag=77)

        self._submit(s, _Part(post, keep.clear), f"send to {peer}", sendbuf)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        s = self._checked(stream, (recvbuf, count, "recvbuf"))
        NcclCommunicator.calls.append(f"recv:{datatype}:{count}:{peer}")
        comm, dtype = self._comm, _NCCL_DTYPES[datatype]
        post = lambda: comm.Irecv(_raw(recvbuf, count, dtype), source=peer, tag=77)  # noqa: E731
        self._submit(s, _Part(post), f"recv from {peer}", recvbuf)

    def destroy(self) -> None:
        """As ncclCommDestroy (which finalizes first): queued work completes, then it is gone."""
        NcclCommunicator.calls.append("destroy")
        for launch in list(self._pending):
            launch.stream._run(launch.position, block=True)
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def abort(self) -> None:
        """As ncclCommAbort: queued work is dropped."""
        NcclCommunicator.calls.append("abort")
        for launch in self._pending:
            launch.aborted = True
        self._pending.clear()
        self._comm = None


def _group_start() -> None:
    _group.append([])


def _group_end() -> None:
    entries = _group.pop()
    if not entries:
        return
    comm, stream = entries[0][0], entries[0][1]
    if any(e[1] is not stream for e in entries):
        raise NcclError("ncclInvalidUsage (stand-in): one group on several streams")
    _launch(comm, stream, [e[2] for e in entries], f"{comm.name} group of {len(entries)}")


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


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
