"""Rank script: multi-node and synchronized iterators keep every rank in step.

Multi-node iterator (master = last rank, so a non-zero master is covered): every rank gets the
master's batches and identical progress (epoch, is_new_epoch, epoch_detail,
previous_epoch_detail), equal to a plain SerialIterator; non-masters pass None or an iterator
over other data that must not be read; repeat=False stops everyone at the same step; reset;
a snapshot written by the master alone loads on every rank and continues identically.
Synchronized iterator: ranks holding different data draw the same shuffle order.
Prints ``PASS <name>`` per check (tests/support/rank_checks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from chainer import serializers
from chainer.iterators import MultithreadIterator, SerialIterator

from mnify.runtime import create_multi_node_iterator, create_synchronized_iterator
from tests.support.rank_checks import make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size
master = size - 1


def dataset() -> list[tuple[np.ndarray, np.int32]]:
    xs = np.arange(11 * 3, dtype=np.float32).reshape(11, 3)
    return [(xs[i], np.int32(i)) for i in range(11)]


def record(it: Any, steps: int) -> list[Any]:
    """(labels, epoch, is_new_epoch, epoch_detail, previous_epoch_detail) for each step."""
    out = []
    for _ in range(steps):
        batch = next(it)
        out.append(
            (
                [int(t) for _, t in batch],
                [x.tolist() for x, _ in batch],
                it.epoch,
                it.is_new_epoch,
                round(it.epoch_detail, 9),
                None if it.previous_epoch_detail is None else round(it.previous_epoch_detail, 9),
            )
        )
    return out


def same_everywhere(name: str, value: Any) -> None:
    values = comm.allgather_obj(value)
    for r, v in enumerate(values):
        assert v == values[0], f"{name}: rank {r} has {v!r}, rank 0 has {values[0]!r}"


def reference(seed: int, batch_size: int, **kwargs: Any) -> SerialIterator:
    np.random.seed(seed)
    return SerialIterator(dataset(), batch_size, **kwargs)


# ---------------------------------------------------------------- repeat, shuffle: 3+ epochs
np.random.seed(1)
if rank == master:
    actual: Any = SerialIterator(dataset(), 4, shuffle=True)
elif rank % 2 == 0:
    actual = None
else:  # an iterator over other data: must never be read
    actual = SerialIterator([(np.zeros(3, np.float32), np.int32(-1))] * 5, 2)
it = create_multi_node_iterator(actual, comm, rank_master=master)
assert it.epoch == 0 and not it.is_new_epoch and it.epoch_detail == 0.0
assert it.previous_epoch_detail is None
got = record(it, 10)
same_everywhere("multi-node batches", got)
assert got == record(reference(1, 4, shuffle=True), 10), "differs from a plain SerialIterator"
assert any(step[3] for step in got) and got[-1][2] == 3, "expected to cross epochs"
passed("multi_node_same_batches")

# ---------------------------------------------------------------- repeat=False stops everyone; reset
np.random.seed(2)
actual = SerialIterator(dataset(), 5, repeat=False, shuffle=False) if rank == master else None
it = create_multi_node_iterator(actual, comm, rank_master=master)
labels = []
for batch in it:  # every rank must leave the loop at the same step (a collective)
    labels.append([int(t) for _, t in batch])
assert labels == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10]], labels
it.reset()
assert it.epoch == 0 and it.epoch_detail == 0.0
assert [int(t) for _, t in next(it)] == [0, 1, 2, 3, 4]
same_everywhere("after reset", (it.epoch_detail, it.current_position))
passed("multi_node_stop_and_reset")

# ---------------------------------------------------------------- snapshot by the master only
np.random.seed(3)
actual = SerialIterator(dataset(), 3, shuffle=True) if rank == master else None
it = create_multi_node_iterator(actual, comm, rank_master=master)
record(it, 5)
saved = None
if rank == master:  # a snapshot extension guarded by the rank: no collective inside
    writer = serializers.DictionarySerializer()
    it.serialize(writer)
    saved = writer.target
continued = record(it, 6)
saved = comm.bcast_obj(saved, root=master)  # "the file": every rank loads the same snapshot
np.random.seed(99)  # the fresh iterator's own shuffle must be overwritten by the snapshot
fresh_actual = SerialIterator(dataset(), 3, shuffle=True) if rank == master else None
fresh = create_multi_node_iterator(fresh_actual, comm, rank_master=master)
fresh.serialize(serializers.NpzDeserializer(saved))
assert fresh.epoch == 1 and abs(fresh.epoch_detail - 15 / 11) < 1e-9, fresh.epoch_detail
assert fresh.previous_epoch_detail is not None and abs(fresh.previous_epoch_detail - 12 / 11) < 1e-9
resumed = record(fresh, 6)
# Batches match up to the epoch's end; the next epoch's shuffle comes from the sampler's RNG,
# which Chainer does not snapshot. Progress matches throughout, on every rank.
assert resumed[:2] == continued[:2]
assert [step[2:] for step in resumed] == [step[2:] for step in continued]
same_everywhere("resumed", resumed)
passed("multi_node_serialize")

# ---------------------------------------------------------------- synchronized: same order, own data
np.random.seed(100 + rank)  # different local seeds: only the broadcast seed may decide the order
own = [(np.full(2, 1000 * rank + i, np.float32), np.int32(i)) for i in range(9)]
sync = create_synchronized_iterator(SerialIterator(own, 4, shuffle=True), comm)
orders = []
for _ in range(7):  # a bit over three epochs
    batch = next(sync)
    assert all(int(x[0]) == 1000 * rank + int(t) for x, t in batch), "must read its own data"
    orders.append([int(t) for _, t in batch])
orders.append((sync.epoch, round(sync.epoch_detail, 9), sync.is_new_epoch))
same_everywhere("synchronized order", orders)
flat = [i for step in orders[:2] for i in step] + orders[2][:1]
assert sorted(flat) == list(range(9)) and flat != list(range(9)), f"not a shuffle: {flat}"
passed("synchronized_order")

# a MultithreadIterator takes the shared sampler too
threaded = create_synchronized_iterator(
    MultithreadIterator(own, 3, shuffle=True, n_threads=1), comm
)
threaded_orders = [[int(t) for _, t in next(threaded)] for _ in range(4)]
threaded.finalize()
same_everywhere("synchronized MultithreadIterator order", threaded_orders)
passed("synchronized_multithread")

# a non-shuffling iterator stays as it is; serialize passes through
plain = create_synchronized_iterator(SerialIterator(own, 4, shuffle=False), comm)
assert [int(t) for _, t in next(plain)] == [0, 1, 2, 3]
writer = serializers.DictionarySerializer()
sync.serialize(writer)
assert int(writer.target["epoch"]) == sync.epoch
passed("synchronized_plain_and_serialize")
