"""Grow the global batch instead of decaying the learning rate (Smith et al., ICLR 2018).

With SGD, dividing the learning rate by ``k`` and multiplying the batch by ``k`` follow the same
noise scale, and the second takes ``k`` times fewer updates -- so ``k`` times fewer gradient
all-reduces -- for the same epochs. ``GrowBatch(factor, trigger)`` multiplies the global batch of
the trainer's global-batch iterator (:mod:`mnify.runtime.iterators.global_batch_iterator`) by
``factor`` at each trigger; the iterator goes on from the same point of its epoch. Past
``max_batch`` it divides the learning rate by ``factor`` instead (Smith's hybrid schedule).

``max_per_rank`` bounds what one rank computes at once (memory): when this rank's share of a
step would exceed it, the step runs several micro-batches -- the same number on every rank --
accumulating the gradients, then one gradient all-reduce and one optimizer update. Each
micro-batch's mean loss is weighted by its share of the rank's part, so the accumulated gradient
is the rank's mean, which the multi-node optimizer then weights by the rank's share of the global
batch: the arithmetic of the large batch, exact for models without batch statistics.
BatchNormalization normalises each micro-batch on its own (not the large batch's statistics).
See docs/global_batch.md ("Growing the batch").
"""

from __future__ import annotations

import math
from typing import Any

import chainer
from chainer import training

from mnify.runtime.iterators import global_step
from mnify.runtime.iterators.global_batch_iterator import GlobalBatchIterator


def learning_rate_name(optimizer: Any) -> str:
    """The hyperparameter a decay schedule of ``optimizer`` would shift: ``lr`` where the
    optimizer has one of its own (SGD, MomentumSGD, RMSprop...), ``alpha`` for Adam's family
    (whose ``lr`` is a read-only value derived from ``alpha``)."""
    actual = getattr(optimizer, "actual_optimizer", optimizer)
    own = vars(actual.hyperparam)
    for name in ("lr", "alpha"):
        if name in own:
            return name
    raise ValueError(
        f"{type(actual).__name__} has neither lr nor alpha: pass GrowBatch(attr=...) to name the "
        "hyperparameter the hybrid schedule divides"
    )


def micro_batch_sizes(share: int, count: int) -> list[int]:
    """``share`` examples cut into ``count`` contiguous micro-batches, sizes differing by one
    at most (some empty when ``share < count``)."""
    base, extra = divmod(share, count)
    return [base + (1 if j < extra else 0) for j in range(count)]


def micro_batch_count(shares: list[int], max_per_rank: int | None) -> int:
    """How many micro-batches every rank runs this step: enough for the largest share."""
    if not max_per_rank or not shares:
        return 1
    return max(1, math.ceil(max(shares) / max_per_rank))


class AccumulatingUpdate:
    """``StandardUpdater.update_core`` cut into micro-batches when a share exceeds the bound.

    Installed by :class:`GrowBatch` on the trainer's updater. ``micro_batches`` is this step's
    count (1: the updater's own step), read by the extension and the tests.
    """

    def __init__(self, updater: Any, max_per_rank: int) -> None:
        self.updater = updater
        self.max_per_rank = max_per_rank
        self.micro_batches = 1

    def __call__(self) -> None:
        updater = self.updater
        iterator = updater.get_iterator("main")
        optimizer = updater.get_optimizer("main")
        batch = iterator.next()
        count = micro_batch_count(list(iterator.shares), self.max_per_rank)
        self.micro_batches = count
        global_step.set_micro_batches(count)
        loss_func = updater.loss_func or optimizer.target
        if count == 1:  # the updater's own step: the loss weighted before backward (exact)
            self._update(optimizer, loss_func, self._arrays(batch))
        else:
            self._accumulate(optimizer, loss_func, batch, count)
        if updater.auto_new_epoch and iterator.is_new_epoch:
            optimizer.new_epoch(auto=True)

    def _arrays(self, part: list[Any]) -> Any:
        return chainer.dataset.convert._call_converter(
            self.updater.converter, part, self.updater.input_device
        )

    @staticmethod
    def _update(optimizer: Any, loss_func: Any, in_arrays: Any) -> None:
        if isinstance(in_arrays, tuple):
            optimizer.update(loss_func, *in_arrays)
        elif isinstance(in_arrays, dict):
            optimizer.update(loss_func, **in_arrays)
        else:
            optimizer.update(loss_func, in_arrays)

    def _accumulate(self, optimizer: Any, loss_func: Any, batch: list[Any], count: int) -> None:
        target = optimizer.target
        if getattr(optimizer, "_use_cleargrads", True):
            target.cleargrads()
        else:
            target.zerograds()
        share, start = len(batch), 0
        for size in micro_batch_sizes(share, count):
            part = batch[start : start + size]
            start += size
            if not part:
                continue  # nothing of this rank's in this micro-batch
            in_arrays = self._arrays(part)
            if isinstance(in_arrays, tuple):
                loss = loss_func(*in_arrays)
            elif isinstance(in_arrays, dict):
                loss = loss_func(**in_arrays)
            else:
                loss = loss_func(in_arrays)
            # the micro-batch's mean loss, weighted to make the sum this rank's mean
            (loss * (size / share)).backward(loss_scale=getattr(optimizer, "_loss_scale", None))
            del loss
        optimizer.update()  # one gradient mean over the ranks (share-weighted), one step


class GrowBatch(training.Extension):  # type: ignore[misc]
    """Multiply the global batch by ``factor`` at each ``trigger`` (see the module docstring).

    ``max_batch``: past it, divide the learning rate (``attr``, default the optimizer's own:
    ``lr`` or Adam's ``alpha``) by ``factor`` instead. ``max_per_rank``: a rank never computes
    more examples at once; larger shares accumulate micro-batches before one all-reduce.
    ``iterator``/``optimizer``: the updater's names (``main``).
    """

    priority = training.PRIORITY_EDITOR

    def __init__(
        self,
        factor: int,
        trigger: Any = (1, "epoch"),
        max_batch: int | None = None,
        max_per_rank: int | None = None,
        attr: str | None = None,
        iterator: str = "main",
        optimizer: str = "main",
    ) -> None:
        if int(factor) != factor or factor < 2:
            raise ValueError(f"GrowBatch's factor must be an integer of at least 2, got {factor!r}")
        if max_per_rank is not None and max_per_rank < 1:
            raise ValueError(f"max_per_rank must be at least 1, got {max_per_rank!r}")
        self.factor = int(factor)
        self.trigger = trigger
        self.max_batch = max_batch
        self.max_per_rank = max_per_rank
        self.attr = attr
        self._iterator_name = iterator
        self._optimizer_name = optimizer
        self.grown = 0  # triggers that multiplied the batch
        self.lr_divided = 0  # triggers past max_batch that divided the learning rate
        self.accumulation: AccumulatingUpdate | None = None

    def _parts(self, trainer: Any) -> tuple[GlobalBatchIterator, Any]:
        iterator = trainer.updater.get_iterator(self._iterator_name)
        if not isinstance(iterator, GlobalBatchIterator):
            raise TypeError(
                "GrowBatch changes the global batch of a global-batch iterator; the updater's "
                f"{self._iterator_name!r} iterator is a {type(iterator).__name__}: make it with "
                "mn.create_global_batch_iterator (mnify convert --data global does)"
            )
        return iterator, trainer.updater.get_optimizer(self._optimizer_name)

    def initialize(self, trainer: Any) -> None:
        """Check the parts, install accumulation, re-apply a resumed run's learning-rate
        divisions (the optimizer's state does not hold its hyperparameters)."""
        _, optimizer = self._parts(trainer)
        if self.attr is None:
            self.attr = learning_rate_name(optimizer)
        if self.max_per_rank is not None and self.accumulation is None:
            updater = trainer.updater
            if type(updater).update_core is not training.updaters.StandardUpdater.update_core:
                raise TypeError(
                    "GrowBatch(max_per_rank=...) accumulates micro-batches in Chainer's "
                    f"StandardUpdater's step; {type(updater).__name__} overrides update_core"
                )
            self.accumulation = AccumulatingUpdate(updater, self.max_per_rank)
            updater.update_core = self.accumulation
        if self.lr_divided:
            value = getattr(optimizer, self.attr)
            setattr(optimizer, self.attr, value / self.factor**self.lr_divided)

    def __call__(self, trainer: Any) -> None:
        iterator, optimizer = self._parts(trainer)
        grown = iterator.batch_size * self.factor
        if self.max_batch is not None and grown > self.max_batch:
            assert self.attr is not None
            setattr(optimizer, self.attr, getattr(optimizer, self.attr) / self.factor)
            self.lr_divided += 1
        else:
            iterator.batch_size = grown
            self.grown += 1

    def serialize(self, serializer: Any) -> None:
        self.grown = int(serializer("grown", self.grown))
        self.lr_divided = int(serializer("lr_divided", self.lr_divided))
