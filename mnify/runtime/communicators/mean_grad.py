"""Gradient averaging and parameter broadcast: many arrays reduced (or broadcast) in place.

The arrays are cut into buckets (:mod:`~mnify.runtime.communicators.buckets`), one collective
per bucket, the 1/size of a mean fused into packing or unpacking; on one host buckets are
averaged through a shared-memory segment instead of MPI, or, without any staging, by single copy
between the ranks' own arrays (:mod:`~mnify.runtime.communicators.single_copy`), whichever the
first calls measure faster (:mod:`~mnify.runtime.communicators.path_choice`). Subclasses choose how one bucket is
all-reduced (``_allreduce_into``, published as a bucket by ``_allreduce_bucket``) or the whole reduction (:meth:`GradientMean._reduce_arrays`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from mnify.runtime import kernels, observers
from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators import shared_memory
from mnify.runtime.communicators import single_copy as single_copy_module
from mnify.runtime.communicators.buckets import PlanCache, place_scale
from mnify.runtime.communicators.marks import collective
from mnify.runtime.communicators.parameters import grads_to_reduce, named_params
from mnify.runtime.communicators.path_choice import MeasuredChoice
from mnify.runtime.communicators.shared_memory import SharedMemoryReducer
from mnify.runtime.communicators.single_copy import SingleCopyReducer
from mnify.runtime.communicators.transport import Transport
from mnify.runtime.debug import CallSignature

# Over MPI, arrays from this size up are reduced in their own memory (one Allreduce per
# bucket-sized piece) instead of being packed with others.
OWN_BUCKET_BYTES = 64 << 10


class GradientMean(Transport):
    """``multi_node_mean_grad``, ``all_reduce``, ``bcast_data`` and their ChainerMN aliases."""

    # set by CommunicatorBase.__init__
    allreduce_grad_dtype: np.dtype[Any] | None
    _plans: PlanCache
    _shm: SharedMemoryReducer | None
    _single_copy: SingleCopyReducer | None
    _mean_paths: dict[tuple[str, tuple[int, ...]], MeasuredChoice]

    # -- the bucketed reduction ------------------------------------------------------------------

    def _reduce_arrays(self, arrays: list[np.ndarray], scale: float) -> None:
        """Sum host ``arrays`` over ranks in place, times ``scale``: in buckets, one collective
        per bucket, the scale fused into unpacking."""
        if not arrays:
            return
        wire = self.allreduce_grad_dtype or np.result_type(*arrays)
        wire = arr.reduction_dtype(np.dtype(wire))
        if self._takes_single_copy(arrays, wire, scale):
            self._mean_on_one_host(arrays, wire, scale)
            return
        shm = self._shm if wire.kind in "fiuc" else None
        flats, flush = arr.contiguous_views(arrays)
        if shm is not None and shm.size == self.size:
            self._segment_mean(shm, arrays, flats, wire, scale)
        elif shm is not None:
            plan = self._plans.get(arrays, wire, shm.slot_bytes, tag="shared")
            for views, buf in plan.pieces(flats):
                with observers.bucket(buf.nbytes):
                    self._shared_mean(shm, views, buf, scale)
        else:
            # over MPI, packing costs two extra passes: only small arrays are worth it
            plan = self._plans.get(
                arrays, wire, self.bucket_bytes, tag="mpi", own_bucket_bytes=OWN_BUCKET_BYTES
            )
            plan.run(flats, lambda buf: self._allreduce_bucket(buf, buf, MPI.SUM), scale)
        flush()

    def _segment_mean(
        self,
        shm: SharedMemoryReducer,
        arrays: list[np.ndarray],
        flats: list[np.ndarray],
        wire: np.dtype[Any],
        scale: float,
    ) -> None:
        """Every rank maps the segment: the mean completes in it, buckets pipelined."""
        plan = self._plans.get(arrays, wire, shm.slot_bytes, tag="shared")
        shm.mean_buckets(plan.pieces(flats), scale, self._sync, self._watchdog)

    def _takes_single_copy(
        self, arrays: list[np.ndarray], wire: np.dtype[Any], scale: float
    ) -> bool:
        """Every rank on one host reaching the others' memory, float32/float64 arrays that need
        no cast, and a scale applied after the sum (a mean or a plain sum)."""
        return (
            self._single_copy is not None
            and wire in (np.float32, np.float64)
            and all(a.dtype == wire for a in arrays)
            and place_scale(scale, wire, self.size).before == 1.0
        )

    def _mean_on_one_host(
        self, arrays: list[np.ndarray], wire: np.dtype[Any], scale: float
    ) -> None:
        """Single copy or the shared-memory segment, whichever measures faster here (both
        give the same bits); ``MNIFY_SINGLE_COPY=1`` skips the measuring."""
        assert self._single_copy is not None
        single = self._single_copy
        flats, flush = arr.contiguous_views(arrays)
        sizes = tuple(int(a.size) for a in arrays)

        def single_copy() -> None:
            single.mean(flats, sizes, scale, self._exchange_addresses, self._sync)

        shm = self._shm
        if shm is None or single_copy_module.forced_by_env():
            single_copy()
        else:

            def segment() -> None:
                self._segment_mean(shm, arrays, flats, wire, scale)

            key = (wire.str, sizes)
            choice = self._mean_paths.get(key)
            if choice is None:
                if len(self._mean_paths) >= single_copy_module.PLANS_KEPT:
                    self._mean_paths.clear()
                choice = self._mean_paths[key] = MeasuredChoice(
                    ["single_copy", "segment"], self._slowest_rank
                )
            choice.run({"single_copy": single_copy, "segment": segment}, time.perf_counter)
        flush()

    def _slowest_rank(self, seconds: float) -> float:
        mine, slowest = np.array([seconds]), np.empty(1)
        self._mpi(self.mpi_comm, "Allreduce", mine, slowest, MPI.MAX)
        return float(slowest[0])

    def _exchange_addresses(self, mine: np.ndarray, every: np.ndarray) -> None:
        self._mpi(self.mpi_comm, "Allgather", mine, every)

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

    # -- public ---------------------------------------------------------------------------------

    @collective
    def all_reduce(self, arrays: list[Any], division: bool = False) -> None:
        """Sum each array of ``arrays`` over ranks, in place; divided by size if ``division``."""
        arrays = list(arrays)
        self._enter(CallSignature.of("all_reduce", arrays))
        self._reduce_staged(arrays, 1.0 / self.size if division else 1.0)

    @collective
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

    @collective
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

    # -- ChainerMN's older names -----------------------------------------------------------------

    @collective
    def allreduce_grad(self, model: Any, zero_fill: bool = False) -> None:
        """ChainerMN's older name for :meth:`multi_node_mean_grad`."""
        self.multi_node_mean_grad(model, zero_fill)

    @collective
    def broadcast_data(self, model: Any) -> None:
        """ChainerMN's older name for :meth:`bcast_data`."""
        self.bcast_data(model)
