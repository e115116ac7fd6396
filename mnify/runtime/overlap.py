"""Gradient averaging overlapped with backward: a bucket scheduler, Chainer-free.

DDP's bucket hooks, for mnify's communicators. The caller (the optimizer wrapper, through
:mod:`mnify.runtime.overlap_hooks`) fixes the order of the gradients -- the order backward
finishes them, agreed by every rank -- and the scheduler cuts them into buckets with the
communicators' own planner (:func:`~mnify.runtime.communicators.buckets.plan_buckets`). During
backward it is told, parameter by parameter, that a gradient is final (:meth:`BucketScheduler.ready`);
as soon as every gradient of the next bucket is final, that bucket is packed (the 1/size of the
mean fused into packing, :func:`~mnify.runtime.communicators.buckets.place_scale`) and its
reduction started without blocking. :meth:`BucketScheduler.wait` gives every gradient that was
never declared final to the scheduler (the caller zero-fills unused parameters, so every rank
reduces the same buckets), starts what is left, waits and unpacks into the gradients.

Buckets start strictly in plan order, on every rank: a bucket whose gradients are ready waits
until the ones before it have started. Non-blocking collectives match by the order they are
issued, so this is what keeps ranks whose backward finishes parameters in another order (a
branch unused on some ranks) from pairing different buckets. They run on a communicator of
their own (a duplicate of the communicator's, made once), so collectives issued inside backward
(MultiNodeBatchNormalization's) never interleave with them on one communicator.

Staging: every bucket is packed into its own slice of one buffer, also a bucket that is one
array in the wire dtype (the sequential path reduces those in the gradient's own memory). A
gradient handed over during backward may share memory with a gradient backward still reads
(Chainer's ``F.add`` returns one array for both inputs), so nothing is written into gradients
before :meth:`~BucketScheduler.wait`.

Two reducers:

- :class:`MpiMeanReducer` (CPU, any communicator): ``Iallreduce`` in place on the staging
  slice; every :meth:`~BucketScheduler.ready` call also tests the requests in flight, since
  Open MPI progresses non-blocking collectives only inside MPI calls. Under
  ``MNIFY_WATCHDOG_TIMEOUT`` the final wait is bounded by the communicator's watchdog.
- :class:`NcclMeanReducer` (``pure_nccl``): a side stream waits on an event recorded on the
  compute stream when the bucket is started, then packs and all-reduces there (``ncclAvg`` when
  :func:`place_scale` says so) on an NCCL communicator of its own; :meth:`wait` makes the side
  stream wait for the end of backward, unpacks there, and makes the compute stream wait for it.
  Nothing blocks the host. The staging buffer comes from the side stream's memory arena, and
  each all-reduce is chained with events to the GPU's other NCCL launches (the communicator's
  own, e.g. MultiNodeBatchNormalization's inside backward):
  :mod:`~mnify.runtime.communicators.nccl_order`. Every rank must still issue those in the same
  order, which backward's fixed order gives. (Run on the CuPy stand-in; unverified on a GPU.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from mnify.runtime import kernels, observers
from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators.buckets import bucket_size, place_scale, plan_buckets

# As the sequential path over MPI: arrays from this size up get buckets of their own.
OWN_BUCKET_BYTES = 64 << 10
# Buckets for overlapped reductions when the communicator has no bucket size of its own.
DEFAULT_BUCKET_BYTES = 4 << 20


class MeanReducer(Protocol):
    """What the scheduler needs from a transport: a staging buffer and non-blocking means."""

    wire: np.dtype[Any]
    scale_before: float

    def allocate(self, n: int) -> Any:
        """A 1-D staging buffer of ``n`` elements of the wire dtype."""
        ...

    def start(self, number: int, views: list[Any], buf: Any) -> None:
        """Pack ``views`` into ``buf`` (times :attr:`scale_before`) and start its mean."""
        ...

    def progress(self) -> None:
        """Let reductions in flight advance (cheap; called at every ready gradient)."""
        ...

    def finish(self, unpack: list[tuple[Any, list[Any]]]) -> None:
        """Wait for every started mean, then unpack each ``(buf, views)`` into its views."""
        ...


class BucketScheduler:
    """Buckets over arrays of fixed sizes, started as their arrays become final.

    ``sizes``: element counts, in the order the buckets follow (rank-agreed; backward's
    order). One scheduler serves every step of one layout: :meth:`begin` starts a step.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        reducer: MeanReducer,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        own_bucket_bytes: int | None = OWN_BUCKET_BYTES,
    ) -> None:
        itemsize = reducer.wire.itemsize
        per_bucket = None if bucket_bytes is None else max(1, bucket_bytes // itemsize)
        alone = None if own_bucket_bytes is None else max(1, own_bucket_bytes // itemsize)
        self.sizes = [int(s) for s in sizes]
        self.buckets = plan_buckets(self.sizes, per_bucket, alone)
        self.reducer = reducer
        offsets = [0]
        for bucket in self.buckets:
            offsets.append(offsets[-1] + bucket_size(bucket))
        self._buffer = reducer.allocate(offsets[-1])
        self._slices = [self._buffer[lo:hi] for lo, hi in zip(offsets, offsets[1:], strict=False)]
        self._buckets_of: list[list[int]] = [[] for _ in self.sizes]
        for number, bucket in enumerate(self.buckets):
            for index in sorted({i for i, _, _ in bucket}):
                self._buckets_of[index].append(number)
        self._needs = [len({i for i, _, _ in b}) for b in self.buckets]
        self.steps = 0
        self.started_early = 0  # buckets started from ready(), over all steps
        self.started_late = 0  # buckets started by wait()
        self.begin()

    def begin(self) -> None:
        """A new step: no gradient final yet, no bucket started."""
        self._flats: list[Any] = [None] * len(self.sizes)
        self._write_back: list[tuple[Any, Any]] = []
        self._missing = list(self._needs)
        self._next = 0
        self._unpack: list[tuple[Any, list[Any]]] = []
        self._waiting = False

    @property
    def started(self) -> int:
        """Buckets started in the current step."""
        return self._next

    def ready(self, index: int, grad: Any) -> None:
        """Array ``index``'s gradient is final (``grad``, its shape as the parameter's): start
        every bucket that can start now. A second call for the same index is ignored."""
        if self._flats[index] is not None:
            return
        if int(grad.size) != self.sizes[index]:
            raise ValueError(
                f"gradient {index} has {int(grad.size)} elements, the plan expects "
                f"{self.sizes[index]}"
            )
        if grad.flags.c_contiguous:
            flat = grad.reshape(-1)
        else:  # a contiguous twin, copied back at wait()
            flat = arr.array_module(grad).ascontiguousarray(grad).reshape(-1)
            self._write_back.append((grad, flat))
        self._flats[index] = flat
        for number in self._buckets_of[index]:
            self._missing[number] -= 1
        self._start_ready()
        self.reducer.progress()

    def _start_ready(self) -> None:
        buckets = self.buckets
        while self._next < len(buckets) and self._missing[self._next] == 0:
            number = self._next
            views = [self._flats[i][lo:hi] for i, lo, hi in buckets[number]]
            buf = self._slices[number]
            self.reducer.start(number, views, buf)
            self._unpack.append((buf, views))
            self._next = number + 1
            if self._waiting:
                self.started_late += 1
            else:
                self.started_early += 1

    def wait(self, fill: Callable[[int], Any]) -> None:
        """Complete the step: every array not yet ready gets ``fill(index)`` (its gradient, e.g.
        zeros for a parameter backward never reached), the remaining buckets start, and every
        mean is waited for and unpacked into the gradients."""
        self._waiting = True
        for index, flat in enumerate(self._flats):
            if flat is None:
                self.ready(index, fill(index))
        self.reducer.finish(self._unpack)
        for original, flat in self._write_back:
            original[...] = flat.reshape(original.shape)
        self.steps += 1
        self.begin()


def _watchdog_of(comm: Any) -> Any:
    return getattr(comm, "_watchdog", None)


class MpiMeanReducer:
    """Non-blocking MPI means on host buffers (every communicator on CPU ranks).

    ``mpi_comm``: the communicator the reductions run on (a duplicate, so they never pair with
    other collectives); ``watchdog``: the owning communicator's, or None; ``wait_all``: the
    communicator's own wait for requests (it marks the rank as waiting for ``mnify run``'s
    failure report, and uses the watchdog), when it has one.
    """

    def __init__(
        self,
        mpi_comm: Any,
        wire: np.dtype[Any],
        size: int,
        watchdog: Any = None,
        wait_all: Callable[[list[Any]], None] | None = None,
    ) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self.mpi_comm = mpi_comm
        self.wire = np.dtype(wire)
        self.scale_before = place_scale(1.0 / size, self.wire).before
        self.watchdog = watchdog
        self.wait_all = wait_all
        self._requests: list[Any] = []

    def allocate(self, n: int) -> Any:
        return np.empty(n, dtype=self.wire)

    def start(self, number: int, views: list[Any], buf: Any) -> None:
        kernels.pack(views, buf, self.scale_before)
        self._requests.append(self.mpi_comm.Iallreduce(self._MPI.IN_PLACE, buf, self._MPI.SUM))
        observers.overlap_bucket_starts(number, int(buf.nbytes))

    def progress(self) -> None:
        if self._requests:
            self._MPI.Request.Testall(self._requests)

    def finish(self, unpack: list[tuple[Any, list[Any]]]) -> None:
        requests, self._requests = self._requests, []
        if requests:
            if self.wait_all is not None:
                self.wait_all(requests)
            elif self.watchdog is None:
                self._MPI.Request.Waitall(requests)
            else:
                self.watchdog.waitall(requests)
        for buf, views in unpack:
            kernels.unpack(buf, views)


class NcclMeanReducer:
    """Means on a side CUDA stream over an NCCL communicator (``pure_nccl``).

    ``nccl_comm``: an NCCL communicator used by nothing else; ``device``: a ``cupy.cuda.Device``
    (entered around every call); ``average``: NCCL averages (``ncclAvg``) rather than sums.
    """

    def __init__(
        self,
        cupy: Any,
        nccl: Any,
        nccl_comm: Any,
        device: Any,
        wire: np.dtype[Any],
        size: int,
        average_over: int | None,
        watchdog: Any = None,
        on_timeout: Callable[[], None] | None = None,
        order: Any = None,
    ) -> None:
        from mnify.runtime.communicators.nccl_order import launch_order
        from mnify.runtime.communicators.pure_nccl import NCCL_DTYPES

        self.cupy, self.nccl, self.nccl_comm, self.device = cupy, nccl, nccl_comm, device
        self.wire = np.dtype(wire)
        placement = place_scale(1.0 / size, self.wire, average_over)
        self.scale_before = placement.before
        self._op = nccl.NCCL_AVG if placement.average else nccl.NCCL_SUM
        self._dtype = int(getattr(nccl, NCCL_DTYPES[self.wire.name]))
        self.watchdog = watchdog
        self.on_timeout = on_timeout
        with device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        # the device's one order of NCCL launches, shared with the communicator's own
        self.order = order if order is not None else launch_order(cupy, int(device.id))

    def allocate(self, n: int) -> Any:
        """The staging buffer, from the side stream's arena: it is packed, reduced and
        unpacked there, so its memory is never handed to another stream while in use."""
        with self.device, self.stream:
            return self.cupy.empty(n, dtype=self.wire)

    def _side_waits_for_current(self) -> None:
        ready = self.cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(self.cupy.cuda.get_current_stream())
        self.stream.wait_event(ready)

    def start(self, number: int, views: list[Any], buf: Any) -> None:
        with self.device:
            # the gradients (and contiguous twins of strided ones) were written on the current
            # stream before this point: the side stream starts after them
            self._side_waits_for_current()
            with self.stream:
                kernels.pack(views, buf, self.scale_before)
                ptr = buf.data.ptr
                self.order.before(self.stream)
                self.nccl_comm.allReduce(
                    ptr, ptr, int(buf.size), self._dtype, self._op, self.stream.ptr
                )
                self.order.after(self.stream)
        observers.overlap_bucket_starts(number, int(buf.nbytes))

    def progress(self) -> None:
        """The GPU progresses on its own."""

    def finish(self, unpack: list[tuple[Any, list[Any]]]) -> None:
        cupy = self.cupy
        with self.device:
            started = time.monotonic()
            # backward's kernels may still read gradients that alias these (F.add): unpack
            # after everything queued so far on the compute stream
            self._side_waits_for_current()
            with self.stream:
                for buf, views in unpack:
                    kernels.unpack(buf, views)
            done = cupy.cuda.Event(block=False, disable_timing=True)
            done.record(self.stream)
            cupy.cuda.get_current_stream().wait_event(done)
            self._settle(done, started)

    def _settle(self, done: Any, started: float) -> None:
        """Under the watchdog: wait for the means with its deadline; abort NCCL past it."""
        dog = self.watchdog
        if dog is None:
            return
        deadline = started + dog.timeout
        pause = 5e-5
        while not done.done:
            if time.monotonic() > deadline:
                if self.on_timeout is not None:
                    self.on_timeout()
                raise dog.timeout_error()
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)


def wire_dtype(comm: Any, dtypes: Sequence[Any], on_device: bool) -> np.dtype[Any]:
    """The dtype buckets travel in, as the communicator's sequential path chooses it."""
    wanted = getattr(comm, "allreduce_grad_dtype", None)
    wire = np.dtype(wanted) if wanted is not None else np.dtype(np.result_type(*dtypes))
    if on_device:
        from mnify.runtime.communicators.pure_nccl import WIRE_DTYPES

        return wire if wire.name in WIRE_DTYPES else np.dtype(np.float64)
    return arr.reduction_dtype(wire)


class OverlapChannel:
    """What one communicator lends overlapped reductions: a duplicate of its MPI communicator
    (and on ``pure_nccl`` an NCCL communicator of their own), made once, collectively."""

    def __init__(self, comm: Any, on_device: bool) -> None:
        self.comm = comm
        self.size = int(comm.size)
        self.rank = int(comm.rank)
        self.on_device = on_device
        self.mpi_comm = comm.mpi_comm.Dup()
        self.nccl_comm: Any = None
        self._reducers: list[NcclMeanReducer] = []
        if on_device:
            from mnify.runtime.communicators.pure_nccl import join_nccl, unique_id_bytes

            nccl = comm._nccl
            mine = unique_id_bytes(nccl.get_unique_id()) if self.rank == 0 else None
            uid = self.mpi_comm.bcast(mine, root=0)
            version = str(getattr(comm._cupy, "__version__", ""))
            with comm._device:
                self.nccl_comm = join_nccl(nccl, version, self.size, uid, self.rank)

    def bcast_obj(self, obj: Any) -> Any:
        """Rank 0's ``obj`` (pickled), on the private communicator."""
        return self.mpi_comm.bcast(obj, root=0)

    def reducer(self, wire: np.dtype[Any]) -> MeanReducer:
        comm = self.comm
        if not self.on_device:
            return MpiMeanReducer(
                self.mpi_comm,
                wire,
                self.size,
                _watchdog_of(comm),
                getattr(comm, "_wait_all", None),
            )
        reducer = NcclMeanReducer(
            comm._cupy,
            comm._nccl,
            self.nccl_comm,
            comm._device,
            wire,
            self.size,
            self.size if getattr(comm, "_can_average", False) else None,
            _watchdog_of(comm),
            self._abort_nccl,
            getattr(comm, "_order", None),
        )
        self._reducers.append(reducer)
        return reducer

    def bucket_bytes(self) -> int | None:
        """The communicator's bucket size (``pure_nccl`` without an explicit one: 4 MiB,
        since one bucket for everything could not start before backward ends)."""
        if self.on_device:
            explicit = getattr(self.comm, "_device_bucket_bytes", None)
            return int(explicit) if explicit else DEFAULT_BUCKET_BYTES
        return int(getattr(self.comm, "bucket_bytes", DEFAULT_BUCKET_BYTES))

    def _abort_nccl(self) -> None:
        comm, self.nccl_comm = self.nccl_comm, None
        if comm is not None:
            try:
                comm.abort()
            except Exception:
                comm.destroy()

    def close(self) -> None:
        if self.nccl_comm is not None:
            for reducer in self._reducers:  # nothing may still be queued on this communicator
                reducer.stream.synchronize()
            self.nccl_comm.destroy()
            self.nccl_comm = None
        from mpi4py import MPI

        if not MPI.Is_finalized():
            self.mpi_comm.Free()
