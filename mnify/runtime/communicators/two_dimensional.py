"""``two_dimensional``: reduce-scatter inside each host, all-reduce shards across hosts, all-gather.

The hierarchical communicator sends every byte between hosts from one rank per host and runs its
three stages one after the other for every bucket, so the link idles while a host reduces and
broadcasts. Here every rank of a host takes part in the inter-host stage, and the stages of
consecutive buckets overlap:

1. inside the host, the ranks reduce-scatter the bucket: rank ``i`` of the host holds the host's
   sum of share ``i`` (shares start on cache lines);
2. across hosts, rank ``i`` of every host all-reduces share ``i`` (a "column" communicator of the
   ranks with the same ``intra_rank``): each host still sends one bucket's worth over its link,
   but through ``intra_size`` connections at once. With two hosts the pair swaps its shares and
   adds them (both directions of the link at once; ``a + b == b + a`` exactly, so both get the
   same bits); with more, a non-blocking MPI all-reduce;
3. inside the host, the ranks all-gather the finished shares.

All three are non-blocking MPI operations on three communicators, driven by a fixed schedule
(the same on every rank, so each communicator sees its collectives in the same order): while
buckets ``k .. k + window - 1`` cross the link, the host reduce-scatters bucket ``k + window``
and all-gathers bucket ``k - 1``. Testing any request drives Open MPI's progress engine for all
of them; a waiting rank sleeps between tests (20-200 us) instead of spinning, leaving the cores
to the ranks and the kernel's network work that have something to do. Buckets default to 1 MiB
(``bucket_bytes`` overrides), with 16 crossing at once (``window``); see the figures below.

Exactness: every element of a share is summed inside a host by one reduce-scatter and across
hosts by one all-reduce whose result every column member shares, then copied by the all-gather,
so every rank gets the same bits. The 1/size of a mean is fused into packing (or applied to a
bucket reduced in its own memory before the sum) as :func:`~mnify.runtime.communicators.buckets.
place_scale` says; on float32/float64 wires it is applied to the host's sum of the share instead
(half the data on two ranks per host), before the sum across hosts.

Hosts with different rank counts have no matching columns: there this communicator is the
hierarchical one (leader reduce, all-reduce, broadcast), as it is on a single host.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from mnify.runtime import kernels, observers
from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators import compression
from mnify.runtime.communicators.buckets import bucket_size, place_scale, reduced_in_place
from mnify.runtime.communicators.hierarchical import HierarchicalCommunicator
from mnify.runtime.communicators.shared_memory import SharedMemoryReducer, share_bounds

# Arrays from this size up are reduced in their own memory, smaller ones packed together (the
# value the MPI path of the other communicators uses).
OWN_BUCKET_BYTES = 64 << 10
# Buckets whose inter-host stage is in flight at once, and their default size. On the 2x2 test
# bed (1 Gbit/s links, 2 cores shared with other jobs, load 8-11), ResNet-50's 102 MB, median
# seconds per mean of 5 reps against a link floor of 0.82 s (spinning waits then): 4 MiB
# buckets with window 1 / 4 / 8 / 16 took 1.30 / 1.08 / 1.03-1.10 / 1.03 (two launches);
# 8 MiB with window 8, 1.08; 4 MiB with 16, 0.97; 2 MiB with 32, 0.94; 1 MiB with 16, 0.91;
# 1 MiB with 32, 0.89; 512 KiB with 64, 1.01. The shaper's queue stayed under 1 MB (no
# bufferbloat): what the window buys is data queued in sockets while a rank waits for a core,
# and small buckets shorten the pipeline's fill and drain. 16 of 1 MiB: 19-38 MiB of staging.
WINDOW = 16
PIPELINE_BUCKET_BYTES = 1 << 20
# polite waiting: tests back to back, then sleeps doubling from the first to the longest
_SPIN_TESTS = 16
_FIRST_SLEEP = 20e-6
_MAX_SLEEP = 200e-6


class _Slot:
    """Staging memory for one bucket in flight: the packed bucket, this rank's share and (two
    hosts) the other host's share."""

    __slots__ = ("elements", "wire", "full", "shard", "peer", "narrow")

    def __init__(
        self,
        elements: int,
        share: int,
        wire: np.dtype[Any],
        pair: bool,
        narrow: np.dtype[Any] | None,
    ) -> None:
        self.elements, self.wire = elements, wire
        self.full: np.ndarray | None = None  # made when a packed bucket first needs it
        self.shard = np.empty(share, dtype=wire)
        crossing = wire if narrow is None else narrow
        self.peer = np.empty(share if pair else 0, dtype=crossing)
        # the share as it crosses hosts, when that is narrower than the wire
        self.narrow = np.empty(share if narrow is not None else 0, dtype=crossing)

    def packing(self, n: int) -> np.ndarray:
        if self.full is None:
            self.full = np.empty(self.elements, dtype=self.wire)
        return self.full[:n]


class _Flight:
    """One bucket on its way: where it is reduced (its own memory or a slot), its pieces, the
    shares' counts and offsets, this rank's share and the request of its current stage."""

    __slots__ = (
        "views",
        "target",
        "packed",
        "counts",
        "displs",
        "shard",
        "peer",
        "narrow",
        "requests",
    )

    def __init__(
        self,
        views: list[np.ndarray],
        target: np.ndarray,
        packed: bool,
        counts: list[int],
        displs: list[int],
        shard: np.ndarray,
        peer: np.ndarray,
        narrow: np.ndarray | None,
    ) -> None:
        self.views, self.target, self.packed = views, target, packed
        self.counts, self.displs, self.shard, self.peer = counts, displs, shard, peer
        self.narrow = narrow  # None: the share crosses in the wire dtype
        self.requests: list[MPI.Request] = []


class TwoDimensionalCommunicator(HierarchicalCommunicator):
    """Reduce-scatter in the host, all-reduce of shards across hosts, all-gather; pipelined."""

    name = "two_dimensional"

    column_comm: MPI.Comm  # rank i of every host (COMM_NULL where hosts differ in rank counts)
    # buckets crossing the link at once; a rank holds window + 3 buckets' staging memory
    window: int = WINDOW

    def __init__(
        self,
        mpi_comm: MPI.Intracomm | None = None,
        *,
        allreduce_grad_dtype: Any = None,
        bucket_bytes: int | None = None,
        inter_host_dtype: Any = None,
    ) -> None:
        super().__init__(
            mpi_comm,
            allreduce_grad_dtype=allreduce_grad_dtype,
            bucket_bytes=bucket_bytes or PIPELINE_BUCKET_BYTES,
            inter_host_dtype=inter_host_dtype,
        )

    def _make_comms(self) -> None:
        super()._make_comms()
        # the same answer on every rank (from the shared topology), so Split matches everywhere
        self._columns = (
            self.topology.hosts_equally_crowded and self.inter_size > 1 and self.intra_size > 1
        )
        color = self.intra_rank if self._columns else MPI.UNDEFINED
        self.column_comm = self.mpi_comm.Split(color, self.inter_rank)
        self._slots: list[_Slot] = []
        self._slot_key: tuple[str, str, int, int, int] = ("", "", 0, 0, 0)

    @property
    def compresses_between_hosts(self) -> bool:
        """Shares cross in ``inter_host_dtype`` when hosts pair up in columns: two hosts swap
        them, more all-reduce them where this MPI sums that dtype."""
        dtype = self.inter_host_dtype
        if dtype is None or not self._columns:
            return False
        return self.inter_size == 2 or arr.mpi_can_reduce(dtype)

    def _narrow(self, wire: np.dtype[Any]) -> np.dtype[Any] | None:
        if not self.compresses_between_hosts:
            return None
        return compression.narrower(self.inter_host_dtype, wire)

    def _create_shared_memory(self) -> SharedMemoryReducer | None:
        if self._columns:  # every stage is MPI; no segment needed
            return None
        return super()._create_shared_memory()

    def _reduce_arrays(self, arrays: list[np.ndarray], scale: float) -> None:
        if not self._columns or not arrays:
            super()._reduce_arrays(arrays, scale)
            return
        wire = arr.reduction_dtype(np.dtype(self.allreduce_grad_dtype or np.result_type(*arrays)))
        plan = self._plans.get(
            arrays, wire, self.bucket_bytes, tag="2d", own_bucket_bytes=OWN_BUCKET_BYTES
        )
        flats, flush = arr.contiguous_views(arrays)
        buckets = [[flats[i][lo:hi] for i, lo, hi in b] for b in plan.buckets]
        sizes = {bucket_size(b) for b in plan.buckets}
        self._pipeline(buckets, wire, sizes, scale)
        flush()

    def _slots_for(
        self, wire: np.dtype[Any], sizes: set[int], narrow: np.dtype[Any] | None
    ) -> list[_Slot]:
        largest = max(sizes, default=0)
        share = 0
        for n in sizes:  # the largest share of any bucket (not always the largest bucket's)
            bounds = share_bounds(n, self.intra_size, wire.itemsize)
            share = max(share, *(hi - lo for lo, hi in zip(bounds, bounds[1:], strict=False)))
        key = (wire.str, "" if narrow is None else narrow.str, largest, share, self.window)
        if key != self._slot_key:
            pair = self.inter_size == 2
            self._slots = [
                _Slot(largest, share, wire, pair, narrow) for _ in range(self.window + 3)
            ]
            self._slot_key = key
        return self._slots

    def _wait(self, requests: list[MPI.Request]) -> None:
        """Until ``requests`` complete: test a few times, then sleep between tests (20 us
        doubling to 200 us), so a rank that waits on the link gives its core to the ranks and
        the kernel work (TCP, the shaper) that have something to do; under the watchdog, its
        wait (which sleeps likewise and keeps the deadline)."""
        if self._watchdog is not None:
            self._wait_all(requests)
            return
        observers.wait_begins()
        try:
            for _ in range(_SPIN_TESTS):
                if MPI.Request.Testall(requests):
                    return
            pause = _FIRST_SLEEP
            while not MPI.Request.Testall(requests):
                time.sleep(pause)
                pause = min(pause * 2, _MAX_SLEEP)
        finally:
            observers.wait_ends()

    def _pipeline(
        self, buckets: list[list[np.ndarray]], wire: np.dtype[Any], sizes: set[int], scale: float
    ) -> None:
        placement = place_scale(scale, wire, self.size)
        narrow = self._narrow(wire)
        slots = self._slots_for(wire, sizes, narrow)
        intra, column = self.intra_comm, self.column_comm
        me, ranks = self.intra_rank, self.intra_size
        # two hosts: the shares are swapped and added, both directions of the link busy at
        # once whatever algorithm Open MPI's non-blocking all-reduce would pick for 2 ranks
        pair = 1 - self.inter_rank if self.inter_size == 2 else None
        window = max(1, int(self.window))
        flights: list[_Flight | None] = [None] * len(buckets)

        def reduce_scatter(k: int) -> None:
            views = buckets[k]
            n = sum(int(v.size) for v in views)
            slot = slots[k % len(slots)]
            packed = not reduced_in_place(views, wire)
            if packed:
                target = slot.packing(n)
                kernels.pack(views, target, placement.before)
            else:
                target = views[0]
                if placement.before != 1.0:
                    kernels.unpack(target, [target], placement.before)
            bounds = share_bounds(n, ranks, wire.itemsize)
            counts = [hi - lo for lo, hi in zip(bounds, bounds[1:], strict=False)]
            mine = counts[me]
            flight = _Flight(
                views,
                target,
                packed,
                counts,
                bounds[:-1],
                slot.shard[:mine],
                slot.peer[:mine],
                None if narrow is None else slot.narrow[:mine],
            )
            flight.requests = [intra.Ireduce_scatter(target, flight.shard, counts, MPI.SUM)]
            flights[k] = flight

        def across_hosts(k: int) -> None:
            flight = flights[k]
            assert flight is not None
            self._wait(flight.requests)
            crossing = flight.shard
            if flight.narrow is not None:
                # rounded only to cross; the 1/size waits until it is wide again
                np.copyto(flight.narrow, flight.shard, casting="same_kind")
                crossing = flight.narrow
            elif placement.average:
                kernels.unpack(flight.shard, [flight.shard], scale)
            if pair is None:
                flight.requests = [column.Iallreduce(MPI.IN_PLACE, crossing, MPI.SUM)]
            else:
                flight.requests = [
                    column.Irecv(flight.peer, source=pair),
                    column.Isend(crossing, dest=pair),
                ]

        def all_gather(k: int) -> None:
            flight = flights[k]
            assert flight is not None
            self._wait(flight.requests)
            if flight.narrow is not None:
                # this host's share as the other hosts received it (rounded), or the sum
                np.copyto(flight.shard, flight.narrow)
            if pair is not None:
                # a + b == b + a bit for bit: both hosts get the same sum
                np.add(flight.shard, flight.peer, out=flight.shard)
            if flight.narrow is not None and placement.average:
                kernels.unpack(flight.shard, [flight.shard], scale)
            spec = [flight.target, (flight.counts, flight.displs)]
            flight.requests = [intra.Iallgatherv(flight.shard, spec)]

        def finish(k: int) -> None:
            flight = flights[k]
            assert flight is not None
            self._wait(flight.requests)
            if flight.packed:
                kernels.unpack(flight.target, flight.views)
            flights[k] = None  # its slot is free for bucket k + len(slots)

        # the schedule: bucket k is reduce-scattered at step k, sent across at k + 1, gathered
        # at k + 1 + window and unpacked at k + 2 + window -- fixed, so every communicator sees
        # the same order on every rank whatever finishes first
        count = len(buckets)
        for step in range(count + 2 + window):
            if step < count:
                reduce_scatter(step)
            if 0 <= step - 1 < count:
                across_hosts(step - 1)
            if 0 <= step - 1 - window < count:
                all_gather(step - 1 - window)
            if 0 <= step - 2 - window < count:
                finish(step - 2 - window)

    def _free_comms(self) -> None:
        if self.column_comm != MPI.COMM_NULL:
            self.column_comm.Free()
        super()._free_comms()
