"""One rank reads the batches, every rank gets the same ones (model parallelism's data feed).

Under model parallelism (channel-parallel layers, layer-wise splits) every rank must see the
same batch at the same step. :func:`create_multi_node_iterator` wraps an ordinary Chainer
iterator: on the master rank it reads, and each ``next()`` broadcasts the batch together with the
iterator's progress (``epoch``, ``is_new_epoch``, ``epoch_detail``, ``previous_epoch_detail``,
``current_position``), so a trainer's stop triggers and schedules fire at the same step on every
rank. The other ranks never touch their own iterator (pass None if they have no data).

Batches travel pickled, so any example type works (tuples, dicts, arrays of any dtype) and every
rank gets equal values. ``next()`` and ``reset()`` are collectives: every rank calls them in the
same order. ``serialize()`` is not (snapshots are usually written by rank 0 alone): the master
serializes the wrapped iterator, the others their mirrored progress under the same keys, so a
snapshot written by the master loads on every rank.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import chainer

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


@dataclass
class Progress:
    """Where an iterator stands: what Chainer's trainer and extensions read."""

    epoch: int = 0
    is_new_epoch: bool = False
    epoch_detail: float = 0.0
    previous_epoch_detail: float | None = None
    current_position: int = 0

    @classmethod
    def of(cls, it: Any) -> Progress:
        """Read ``it``'s progress (attributes it lacks keep their defaults)."""
        return cls(
            epoch=int(getattr(it, "epoch", 0)),
            is_new_epoch=bool(getattr(it, "is_new_epoch", False)),
            epoch_detail=float(getattr(it, "epoch_detail", 0.0)),
            previous_epoch_detail=getattr(it, "previous_epoch_detail", None),
            current_position=int(getattr(it, "current_position", 0)),
        )


class MultiNodeIterator(chainer.dataset.Iterator):
    """The wrapper :func:`create_multi_node_iterator` returns, on every rank."""

    def __init__(
        self, actual_iterator: Any, communicator: CommunicatorBase, rank_master: int = 0
    ) -> None:
        self.actual_iterator = actual_iterator
        self.communicator = communicator
        self.rank_master = rank_master
        self.is_master = communicator.rank == rank_master
        if self.is_master and actual_iterator is None:
            raise ValueError(f"the master rank {rank_master} needs an iterator to read from")
        # The epoch size lets non-masters recompute epoch_detail after loading a snapshot.
        start = (
            (asdict(Progress.of(actual_iterator)), _epoch_size(actual_iterator))
            if self.is_master
            else None
        )
        state, self.epoch_size = communicator.bcast_obj(start, root=rank_master)
        self.progress = Progress(**state)

    # -- iteration (collective) -------------------------------------------------------------------

    def __next__(self) -> Any:
        message = None
        if self.is_master:
            try:
                batch = next(self.actual_iterator)
                message = (False, batch, asdict(Progress.of(self.actual_iterator)))
            except StopIteration:
                message = (True, None, asdict(Progress.of(self.actual_iterator)))
        stop, batch, state = self.communicator.bcast_obj(message, root=self.rank_master)
        self.progress = Progress(**state)
        if stop:
            raise StopIteration
        return batch

    next = __next__

    def reset(self) -> None:
        """Restart from the beginning of the data (collective: the master's state is shared)."""
        state = None
        if self.is_master:
            self.actual_iterator.reset()
            state = asdict(Progress.of(self.actual_iterator))
        self.progress = Progress(**self.communicator.bcast_obj(state, root=self.rank_master))

    def finalize(self) -> None:
        # Also reached from Iterator.__del__, possibly on a half-constructed object.
        actual: Any = self.__dict__.get("actual_iterator")
        if self.__dict__.get("is_master") and hasattr(actual, "finalize"):
            actual.finalize()

    # -- progress, identical on every rank --------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    @property
    def is_new_epoch(self) -> bool:
        return self.progress.is_new_epoch

    @property
    def epoch_detail(self) -> float:
        return self.progress.epoch_detail

    @property
    def previous_epoch_detail(self) -> float | None:
        return self.progress.previous_epoch_detail

    @property
    def current_position(self) -> int:
        return self.progress.current_position

    def __getattr__(self, name: str) -> Any:
        # Anything else (batch_size, dataset, repeat, ...) comes from the wrapped iterator.
        actual = self.__dict__.get("actual_iterator")
        if actual is None:
            raise AttributeError(name)
        return getattr(actual, name)

    # -- snapshots (not collective) ---------------------------------------------------------------

    def serialize(self, serializer: Any) -> None:
        if self.is_master:
            self.actual_iterator.serialize(serializer)
            self.progress = Progress.of(self.actual_iterator)
            return
        p = self.progress
        p.current_position = int(serializer("current_position", p.current_position))
        p.epoch = int(serializer("epoch", p.epoch))
        p.is_new_epoch = bool(serializer("is_new_epoch", p.is_new_epoch))
        previous = -1.0 if p.previous_epoch_detail is None else p.previous_epoch_detail
        try:
            previous = float(serializer("previous_epoch_detail", previous))
        except KeyError:
            pass
        p.previous_epoch_detail = None if previous < 0 else previous
        if self.epoch_size:
            p.epoch_detail = p.epoch + p.current_position / self.epoch_size
        else:
            p.epoch_detail = float(p.epoch)


def _epoch_size(it: Any) -> int | None:
    """Examples per epoch, when the iterator can tell (SerialIterator and friends can)."""
    size = getattr(it, "_epoch_size", None)
    if size is None:
        dataset = getattr(it, "dataset", None)
        size = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
    return int(size) if size is not None else None


def create_multi_node_iterator(
    actual_iterator: Any, communicator: CommunicatorBase, rank_master: int = 0
) -> MultiNodeIterator:
    """Wrap ``actual_iterator`` so every rank gets ``rank_master``'s batches and progress.

    Every rank must call this (it broadcasts the starting state). Non-master ranks may pass
    None: their iterator is never read.
    """
    return MultiNodeIterator(actual_iterator, communicator, rank_master)
