"""Single-process pieces of the communicators: bucket plans, topology, debug messages, env knobs."""

from __future__ import annotations

import mmap
import threading
import time
from typing import Any

import numpy as np
import pytest

from mnify import environment
from mnify.runtime import debug, watchdog
from mnify.runtime.communicators import shared_memory
from mnify.runtime.communicators.buckets import (
    BucketPlan,
    PlanCache,
    ScalePlacement,
    place_scale,
    plan_buckets,
)
from mnify.runtime.communicators.topology import Topology
from mnify.runtime.debug import CallSignature


def _covered(plan: BucketPlan, sizes: list[int]) -> list[list[tuple[int, int]]]:
    """Per array, the (lo, hi) pieces the plan reduces, in order."""
    seen: list[list[tuple[int, int]]] = [[] for _ in sizes]
    for bucket in plan.buckets:
        for index, lo, hi in bucket:
            seen[index].append((lo, hi))
    return seen


@pytest.mark.parametrize("bucket_floats", [1, 4, 16, 100, 10_000])
def test_bucket_plan_covers_every_element_once_within_bucket_size(bucket_floats: int) -> None:
    sizes = [3, 40, 0, 1, 17, 8, 8, 100, 2]
    plan = BucketPlan.build(sizes, np.dtype(np.float32), bucket_floats * 4)
    for bucket in plan.buckets:
        assert sum(hi - lo for _, lo, hi in bucket) <= bucket_floats
    for size, pieces in zip(sizes, _covered(plan, sizes), strict=True):
        covered = sorted(pieces)
        assert sum(hi - lo for lo, hi in covered) == size
        if size:
            assert covered[0][0] == 0 and covered[-1][1] == size
            assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))
    assert plan.buffer.size == max(sum(hi - lo for _, lo, hi in b) for b in plan.buckets)


def test_large_arrays_get_buckets_of_their_own_small_ones_are_packed() -> None:
    plan = BucketPlan.build([10, 30, 3, 25, 4], np.dtype(np.float64), 20 * 8)
    by_array = {}
    for bucket in plan.buckets:
        arrays = {i for i, _, _ in bucket}
        for i in arrays:
            by_array.setdefault(i, []).append(arrays)
    # 10, 30 and 25 floats are at least half a 20-float bucket: alone in theirs, split evenly
    for i in (0, 1, 3):
        assert all(group == {i} for group in by_array[i])
    assert [hi - lo for b in plan.buckets for j, lo, hi in b if j == 1] == [15, 15]
    # 3 and 4 share one packed bucket
    assert {2, 4} in [set(i for i, _, _ in b) for b in plan.buckets]


def test_arrays_from_own_bucket_bytes_up_are_never_packed() -> None:
    plan = BucketPlan.build([100, 3, 9, 8, 2], np.dtype(np.float32), 400, own_bucket_bytes=32)
    groups = [sorted({i for i, _, _ in b}) for b in plan.buckets]
    assert groups == [[0], [2], [3], [1, 4]]


def test_plan_run_reduces_scales_and_casts() -> None:
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(5, dtype=np.float16),
        np.arange(40, dtype=np.float32),
    ]
    want = [a.astype(np.float64) * 3 * 0.5 for a in arrays]
    plan = BucketPlan.build([a.size for a in arrays], np.dtype(np.float32), 16 * 4)
    flats = [a.reshape(-1) for a in arrays]
    calls: list[int] = []

    def triple(buf: np.ndarray) -> None:  # stands in for an allreduce over 3 equal ranks
        calls.append(buf.size)
        buf *= 3

    plan.run(flats, triple, scale=0.5)
    for got, expect in zip(arrays, want, strict=True):
        np.testing.assert_allclose(got.astype(np.float64), expect, rtol=1e-3)
    assert len(calls) == len(plan.buckets) and all(c <= 16 for c in calls)


def test_plan_cache_reuses_plans_and_buffers_per_layout() -> None:
    cache = PlanCache(keep=2)
    a = [np.zeros((2, 3), np.float32), np.zeros(5, np.float32)]
    first = cache.get(a, np.dtype(np.float32), 1 << 20)
    assert cache.get([x.copy() for x in a], np.dtype(np.float32), 1 << 20) is first
    assert cache.get(a, np.dtype(np.float16), 1 << 20) is not first
    cache.get([np.zeros(7, np.float32)], np.dtype(np.float32), 1 << 20)
    # keep=2: the least recently used layout was dropped
    assert cache.get(a, np.dtype(np.float32), 1 << 20) is not first


def test_topology_groups_ranks_by_host_in_order_of_lowest_rank() -> None:
    names = ["b", "a", "b", "c", "a", "b"]
    views = [Topology.from_names(r, names) for r in range(len(names))]
    assert [t.inter_rank for t in views] == [0, 1, 0, 2, 1, 0]
    assert [t.intra_rank for t in views] == [0, 0, 1, 0, 1, 2]
    assert [t.intra_size for t in views] == [3, 2, 3, 1, 2, 3]
    assert all(t.inter_size == 3 for t in views)
    assert views[0].spans_hosts_with_several_ranks
    assert not Topology.from_names(0, ["x", "y"]).spans_hosts_with_several_ranks
    assert not Topology.from_names(1, ["x", "x"]).spans_hosts_with_several_ranks


def test_debug_messages_name_ranks_and_what_they_passed() -> None:
    a = np.zeros((4, 3), np.float32)
    b = np.zeros((5, 3), np.float32)
    sigs = [CallSignature.of("allreduce", [a]), CallSignature.of("allreduce", [b])]
    assert debug.mismatch_message(sigs) == (
        "allreduce: rank 0 passed float32(4,3), rank 1 passed float32(5,3)"
    )
    sigs = [CallSignature.of("allreduce", [a])] * 3 + [CallSignature("bcast", root=0)]
    assert debug.mismatch_message(sigs) == (
        "ranks entered different collectives: ranks 0-2 entered allreduce, rank 3 entered bcast"
    )
    # gathers may differ in shape but not in dtype
    g = [CallSignature.of("allgather", [a]), CallSignature.of("allgather", [b])]
    assert debug.mismatch_message(g) is None
    g.append(CallSignature.of("allgather", [b.astype(np.float16)]))
    message = debug.mismatch_message(g)
    assert message is not None and "rank 2 passed float16(5,3)" in message
    roots = [CallSignature("bcast", root=0), CallSignature("bcast", root=1)]
    assert debug.mismatch_message(roots) == (
        "bcast: rank 0 passed no arrays (root=0), rank 1 passed no arrays (root=1)"
    )


def test_env_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(environment.WATCHDOG_TIMEOUT.name, raising=False)
    assert watchdog.timeout_from_env() is None
    monkeypatch.setenv(environment.WATCHDOG_TIMEOUT.name, "2.5")
    assert watchdog.timeout_from_env() == 2.5
    monkeypatch.setenv(environment.WATCHDOG_TIMEOUT.name, "0")
    assert watchdog.timeout_from_env() is None
    monkeypatch.setenv(environment.WATCHDOG_TIMEOUT.name, "soon")
    with pytest.raises(ValueError, match="MNIFY_WATCHDOG_TIMEOUT"):
        watchdog.timeout_from_env()
    for value, on in (("1", True), ("yes", True), ("0", False), ("", False), ("off", False)):
        monkeypatch.setenv(environment.DEBUG.name, value)
        assert debug.enabled() is on


def test_shared_memory_slots_hold_a_bucket_within_the_segment_budget() -> None:
    budget, cap = shared_memory.SEGMENT_BUDGET, shared_memory.SLOT_CAP
    assert shared_memory.slot_size(4 << 20, 2) == cap  # cache-sized, not bucket-sized
    assert shared_memory.slot_size(cap // 2, 2) == cap // 2
    slot = shared_memory.slot_size(4 << 20, 100)  # 2 x 101 slots of SLOT_CAP would not fit
    assert slot < cap and slot % 64 == 0 and 2 * 101 * slot <= budget < 2 * 101 * (slot + 64)
    assert shared_memory.slot_size(64, 1000) == 64  # tiny buckets stay as they are


def test_copies_of_a_model_share_its_communicator() -> None:
    """``copy.deepcopy`` of a model holding a communicator (MNBN, ParallelConvolution2D) shares it."""
    import copy

    from mnify.runtime.communicators import create_communicator

    comm = create_communicator("naive")
    holder = {"comm": comm, "weights": np.ones(3)}
    clone = copy.deepcopy(holder)
    assert clone["comm"] is comm and copy.copy(comm) is comm
    assert clone["weights"] is not holder["weights"]


def test_one_scale_policy_for_host_and_device() -> None:
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    # NCCL averages a 1/size mean on float32/float64 wires: nothing else scales
    assert place_scale(0.25, f32, average_over=4) == ScalePlacement(1.0, True)
    assert place_scale(0.5, np.dtype(np.float64), average_over=2) == ScalePlacement(1.0, True)
    # float16 wires: packing scales in float32 and rounds once, better than a float16 factor
    assert place_scale(0.25, f16, average_over=4) == ScalePlacement(0.25, False)
    # no averaging reduction (MPI, shared memory), or a scale that is not 1/size: before the sum
    assert place_scale(0.25, f32) == ScalePlacement(0.25, False)
    assert place_scale(0.1, f32, average_over=4) == ScalePlacement(0.1, False)
    assert place_scale(1.0, f32, average_over=4) == ScalePlacement(1.0, False)


def test_in_place_buckets_are_scaled_before_the_sum() -> None:
    """A float16 bucket reduced in its own memory: summing first would overflow, the mean
    does not."""
    big = np.full(64, 40000.0, dtype=np.float16)
    plan = BucketPlan.build([big.size], np.dtype(np.float16), 64 * 2)
    seen: list[float] = []

    def double(buf: np.ndarray) -> None:  # two equal ranks
        seen.append(float(buf.max()))
        buf += buf

    plan.run([big], double, scale=0.5)
    assert seen == [20000.0] and np.all(big == 40000.0)


def test_planner_with_no_bucket_size_packs_everything_in_one() -> None:
    assert plan_buckets([4, 0, 9], None) == [[(0, 0, 4), (2, 0, 9)]]
    plan = BucketPlan.build([4, 0, 9], np.dtype(np.float32), None)
    assert plan.buckets == [[(0, 0, 4), (2, 0, 9)]] and plan.buffer.size == 13


def test_shares_cover_a_bucket_on_cache_lines() -> None:
    for n, size, itemsize in [(1000, 2, 4), (1000, 3, 4), (7, 3, 4), (0, 2, 8), (33, 4, 2)]:
        bounds = shared_memory.share_bounds(n, size, itemsize)
        assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == size + 1
        assert all(a <= b for a, b in zip(bounds, bounds[1:], strict=False))
        assert all(b * itemsize % 64 == 0 for b in bounds[:-1])


def _reducers(size: int, slot_bytes: int) -> list[shared_memory.SharedMemoryReducer]:
    """``size`` ranks' reducers over one anonymous mapping, for threads of one process."""
    nbytes = shared_memory._header_bytes(size) + 2 * (size + 1) * slot_bytes
    segment = mmap.mmap(-1, nbytes)
    return [shared_memory.SharedMemoryReducer(segment, r, size, slot_bytes) for r in range(size)]


@pytest.mark.parametrize(("size", "ordered"), [(2, True), (3, True), (3, False)])
def test_pipelined_shared_mean_in_threads(size: int, ordered: bool) -> None:
    """The counter protocol, with ranks as threads that stall at random between buckets:
    every rank ends with the same bits, equal to the mean. ``ordered=False``: the barrier
    path used where stores are not ordered."""
    slot = 256
    reducers = _reducers(size, slot)
    sizes = [3, 200, 17, 0, 64, 5, 150, 1, 90]
    dtypes = [np.float32, np.float32, np.float16, np.float32, np.float64, np.float32]
    dtypes += [np.float32, np.float32, np.float32]
    inputs = [
        [np.random.default_rng(10 * r + i).standard_normal(n) for i, n in enumerate(sizes)]
        for r in range(size)
    ]
    gate = threading.Barrier(size)
    results: list[list[list[np.ndarray]]] = [[] for _ in range(size)]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        reducer = reducers[r]
        reducer.ordered_stores = ordered
        rng = np.random.default_rng(r)
        try:
            for _step in range(3):
                arrays = [x.astype(d) for x, d in zip(inputs[r], dtypes, strict=True)]
                plan = BucketPlan.build(sizes, np.dtype(np.float32), slot)

                def stalling(arrays: list[np.ndarray] = arrays, plan: BucketPlan = plan) -> Any:
                    for bucket in plan.pieces(arrays):
                        time.sleep(float(rng.uniform(0, 2e-3)))
                        yield bucket

                reducer.mean_buckets(stalling(), 1.0 / size, gate.wait)
                results[r].append(arrays)
        except BaseException as exc:  # surfaces in the main thread
            errors.append(exc)
            gate.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads)
    for i, dtype in enumerate(dtypes):
        mean = sum(inputs[r][i].astype(dtype).astype(np.float64) for r in range(size)) / size
        tol = 2e-3 if dtype == np.float16 else 1e-6
        for step in range(3):
            got = results[0][step][i]
            np.testing.assert_allclose(got.astype(np.float64), mean, rtol=tol, atol=tol)
            for r in range(1, size):
                assert np.array_equal(results[r][step][i], got), (i, r, step)


def test_current_communicator_is_the_last_one_created(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a converted training helper fetches: the entry point's communicator."""
    from mnify.runtime import communicators

    monkeypatch.setattr(communicators, "_current", None)
    with pytest.raises(RuntimeError, match="create_communicator"):
        communicators.current_communicator()
    comm = communicators.create_communicator("naive")
    assert communicators.current_communicator() is comm
    comm.split(0, comm.rank)  # a split is not the script's communicator
    assert communicators.current_communicator() is comm
