"""Every rank iterates its own data in the same shuffled order.

For splits where ranks hold different parts of each example (an encoder's input on one rank,
the decoder's targets on another) the ranks must visit examples in the same order without
shipping the data. :func:`create_synchronized_iterator` broadcasts one random seed from rank 0
and gives the wrapped iterator a shuffle sampler drawing from it, so every rank's
``order_sampler`` produces the same permutations, epoch after epoch. Datasets must be the same
length on every rank. An iterator that does not shuffle (``order_sampler`` None) is already in
step and is left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import chainer
import numpy as np

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


class SynchronizedIterator(chainer.dataset.Iterator):
    """The wrapped iterator, re-seeded; everything else is delegated to it unchanged."""

    def __init__(self, actual_iterator: Any, communicator: CommunicatorBase) -> None:
        if not hasattr(actual_iterator, "order_sampler"):
            raise TypeError(
                f"{type(actual_iterator).__name__} has no order_sampler: use an iterator that "
                "takes one (SerialIterator, MultithreadIterator, MultiprocessIterator)"
            )
        self.__dict__["actual_iterator"] = actual_iterator
        self.__dict__["communicator"] = communicator
        seed = int(np.random.randint(0, 2**31 - 1)) if communicator.rank == 0 else None
        seed = int(communicator.bcast_obj(seed, root=0))
        self.__dict__["seed"] = seed
        if actual_iterator.order_sampler is not None:
            actual_iterator.order_sampler = chainer.iterators.ShuffleOrderSampler(
                np.random.RandomState(seed)
            )
            # The first epoch's order was drawn with the old sampler: draw it again.
            actual_iterator.reset()

    def __next__(self) -> Any:
        return next(self.actual_iterator)

    next = __next__

    def __getattr__(self, name: str) -> Any:
        actual = self.__dict__.get("actual_iterator")
        if actual is None:
            raise AttributeError(name)
        return getattr(actual, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.actual_iterator, name, value)

    # chainer.dataset.Iterator defines these (its __del__ calls finalize): route them explicitly.
    def reset(self) -> None:
        self.actual_iterator.reset()

    def finalize(self) -> None:
        actual = self.__dict__.get("actual_iterator")
        if actual is not None:
            actual.finalize()

    def serialize(self, serializer: Any) -> None:
        self.actual_iterator.serialize(serializer)


def create_synchronized_iterator(
    actual_iterator: Any, communicator: CommunicatorBase
) -> SynchronizedIterator:
    """Wrap ``actual_iterator`` so every rank draws the same shuffle order (collective)."""
    return SynchronizedIterator(actual_iterator, communicator)
