"""One global sample schedule, whatever the number of ranks: each rank reads its part of it.

``create_global_batch_iterator(dataset, batch_size, comm)`` iterates like Chainer's
``SerialIterator(dataset, batch_size)`` in one process -- same ``epoch``, ``epoch_detail``,
``previous_epoch_detail``, ``is_new_epoch``, batches wrapping across epoch ends -- but
``batch_size`` is the *global* batch, and each rank's ``next()`` returns only its contiguous
part of it, reading only those examples. Every rank holds the whole dataset. Epoch ``e``'s order
is a permutation drawn from ``(seed, e)`` alone, so the state (epoch, position, order, global
batch) is the same on every rank and at every world size: a snapshot resumes at any number of
ranks with exactly the examples not yet seen (:mod:`mnify.runtime.extensions.global_snapshot`).

The split (``split``): ``"even"``; a sequence of per-rank weights (fixed, proportional);
``"speed"``: proportional to each rank's measured speed, collective time excluded
(:class:`~mnify.runtime.iterators.batch_split.SpeedSplit`), agreed with one small allgather per
step. While training, each step's shares are recorded for the multi-node optimizer, which weights
this rank's loss by ``size * n_r / N`` so any split gives one process's gradient
(:mod:`.global_step`, docs/global_batch.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np

from mnify.runtime import observers
from mnify.runtime.iterators import empty_share_fixes, global_step
from mnify.runtime.iterators.batch_split import (
    CollectiveClock,
    SpeedSplit,
    even_shares,
    proportional_shares,
)

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

SPLITS = ("even", "speed")
empty_share_fixes.apply()


def epoch_order(seed: int, epoch: int, length: int) -> np.ndarray:
    """Epoch ``epoch``'s permutation of ``range(length)``: a function of the seed and the epoch
    only, so resuming needs no generator state and every rank draws the same one."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch)])))
    return rng.permutation(length).astype(np.intp)


class GlobalBatchIterator(chainer.dataset.Iterator):  # type: ignore[misc]
    """See the module docstring; made by :func:`create_global_batch_iterator` (a collective)."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        comm: CommunicatorBase,
        repeat: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        split: str | Sequence[float] = "even",
        n_threads: int = 1,
    ) -> None:
        self.dataset = dataset
        self.comm = comm
        self._repeat = bool(repeat)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        if isinstance(split, str):
            if split not in SPLITS:
                raise ValueError(
                    f"split must be one of {SPLITS} or per-rank weights, got {split!r}"
                )
            self.split: str | tuple[float, ...] = split
        else:
            weights = tuple(float(w) for w in split)
            if len(weights) != comm.size or min(weights) <= 0:
                raise ValueError(
                    f"split weights need one positive number per rank ({comm.size}), got {split!r}"
                )
            self.split = weights
        if int(n_threads) < 1:
            raise ValueError(f"n_threads must be at least 1, got {n_threads}")
        # threads reading this rank's examples (a dataset that decodes files in get_example)
        self._readers = ThreadPoolExecutor(int(n_threads)) if int(n_threads) > 1 else None
        self._check_agreement(len(dataset), int(batch_size))
        self._batch_size = int(batch_size)
        self._speed = SpeedSplit(comm.size) if split == "speed" else None
        self._clock: CollectiveClock | None = None
        self._unsubscribe: Any = None
        if self._speed is not None:
            self._clock = CollectiveClock()
            self._unsubscribe = observers.subscribe(self._clock)
        self._mark: float | None = None  # when this rank's last step began (speed split)
        self._mark_inside = 0.0
        self._last_share = 0
        self.shares: list[int] = []  # the last step's shares, per rank
        self.global_indices: np.ndarray = np.zeros(0, np.intp)  # the last global batch
        self.reset()

    # -- construction checks (collective) ----------------------------------------------------------

    def _check_agreement(self, length: int, batch_size: int) -> None:
        """Every rank has a dataset of the same length and the same global batch; one allgather,
        so every rank raises the same error rather than one hanging in a later collective."""
        everyone = self.comm.allgather_obj((length, batch_size, self.seed))
        lengths = [e[0] for e in everyone]
        if len(set(lengths)) > 1:
            listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(lengths))
            raise ValueError(
                "create_global_batch_iterator needs the whole dataset on every rank, of the same "
                f"length; the ranks' datasets have lengths {listed}"
            )
        if len({e[1] for e in everyone}) > 1 or len({e[2] for e in everyone}) > 1:
            raise ValueError(
                "create_global_batch_iterator needs the same batch_size and seed on every rank; "
                f"got (length, batch_size, seed) per rank {everyone}"
            )
        self._check_batch(batch_size)
        if self._repeat and length == 0:
            raise ValueError("an iterator that repeats needs a non-empty dataset")

    def _check_batch(self, batch_size: int) -> None:
        if batch_size < self.comm.size:
            raise ValueError(
                f"the global batch ({batch_size}) is smaller than the number of ranks "
                f"({self.comm.size}): every rank needs at least one example of each batch; "
                "use a global batch of at least the number of ranks, or fewer ranks"
            )

    # -- the global batch ---------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """The global batch; settable between steps (identically on every rank), e.g. to grow it."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self._check_batch(int(value))
        self._batch_size = int(value)

    @property
    def repeat(self) -> bool:
        return self._repeat

    @property
    def epoch_detail(self) -> float:
        return self.epoch + self.current_position / self._epoch_size

    @property
    def previous_epoch_detail(self) -> float | None:
        return None if self._previous_epoch_detail < 0 else self._previous_epoch_detail

    @property
    def _epoch_size(self) -> int:
        return len(self.dataset) if self.order is None else len(self.order)

    @property
    def share(self) -> int:
        """This rank's number of examples in the last step."""
        return self.shares[self.comm.rank] if self.shares else 0

    def reset(self) -> None:
        self.current_position = 0
        self.epoch = 0
        self.is_new_epoch = False
        self.iteration = 0
        self._previous_epoch_detail = -1.0
        self.order = self._order_of(0)
        self._mark = None  # the time until the first step after a reset measures nothing
        global_step.withdraw(id(self))

    def _order_of(self, epoch: int) -> np.ndarray | None:
        return epoch_order(self.seed, epoch, len(self.dataset)) if self.shuffle else None

    def _take_global_batch(self) -> np.ndarray | None:
        """Advance the global schedule by one batch (SerialIterator's rules for one process)."""
        if not self._repeat and self.epoch > 0:
            return None
        n = self._epoch_size
        if self._repeat and n == 0:
            raise ValueError("an iterator that repeats needs a non-empty dataset")
        position = self.current_position
        end = position + self._batch_size
        parts: list[np.ndarray] = []
        self.is_new_epoch = False
        while end >= n:
            parts.append(self._positions(position, n))
            self.epoch += 1
            self.is_new_epoch = True
            self.order = self._order_of(self.epoch)
            position = 0
            if not self._repeat:
                end = 0
                break
            end -= n
        parts.append(self._positions(position, end))
        self.current_position = end
        return np.concatenate(parts)

    def _positions(self, start: int, stop: int) -> np.ndarray:
        if self.order is None:
            return np.arange(start, stop, dtype=np.intp)
        return self.order[start:stop]

    def _split(self, total: int) -> list[int]:
        size = self.comm.size
        if self._speed is not None:
            self._speed.observe(self.comm.allgather_obj(self._measure()))
            return self._speed.split(total)
        if isinstance(self.split, tuple):
            return proportional_shares(total, self.split)
        return even_shares(total, size)

    def _measure(self) -> float | None:
        """This rank's seconds per example since its last step began, collectives excluded."""
        assert self._clock is not None
        now = time.perf_counter()
        measured = None
        if self._mark is not None and self._last_share > 0:
            compute = (now - self._mark) - (self._clock.inside - self._mark_inside)
            measured = compute / self._last_share if compute > 0 else None
        return measured

    def __next__(self) -> list[Any]:
        self._previous_epoch_detail = self.epoch_detail
        indices = self._take_global_batch()
        if indices is None:
            global_step.withdraw(id(self))
            raise StopIteration
        self.iteration += 1
        shares = self._split(len(indices))
        if self._clock is not None:  # the next measurement starts now, after the allgather
            self._mark = time.perf_counter()
            self._mark_inside = self._clock.inside
        rank = self.comm.rank
        self.shares = shares
        self.global_indices = indices
        self._last_share = shares[rank]
        if chainer.config.train:
            global_step.record(
                global_step.GlobalStep(self.iteration, len(indices), tuple(shares), rank, id(self))
            )
        start = sum(shares[:rank])
        mine = [int(i) for i in indices[start : start + shares[rank]]]
        if self._readers is not None and len(mine) > 1:
            return list(self._readers.map(self.dataset.__getitem__, mine))
        return [self.dataset[i] for i in mine]

    next = __next__

    def serialize(self, serializer: Any) -> None:
        """The schedule's state, the same at any world size; the loaded global batch wins."""
        length = serializer("dataset_length", len(self.dataset))
        if int(length) != len(self.dataset):
            raise ValueError(
                f"this iterator state was saved for a dataset of {int(length)} examples; the "
                f"dataset here has {len(self.dataset)}: resume with the same dataset"
            )
        self.current_position = int(serializer("current_position", self.current_position))
        self.epoch = int(serializer("epoch", self.epoch))
        self.is_new_epoch = bool(serializer("is_new_epoch", self.is_new_epoch))
        self.iteration = int(serializer("iteration", self.iteration))
        self.seed = int(serializer("seed", self.seed))
        self._previous_epoch_detail = float(
            serializer("previous_epoch_detail", self._previous_epoch_detail)
        )
        batch_size = int(serializer("global_batch_size", self._batch_size))
        if batch_size != self._batch_size:
            self.batch_size = batch_size
        if self.shuffle:
            order = self.order if self.order is not None else self._order_of(self.epoch)
            loaded = serializer("order", order)
            if loaded is not None:
                self.order = np.asarray(loaded, dtype=np.intp)
        global_step.withdraw(id(self))

    def __del__(self) -> None:
        # Chainer's Iterator.__del__ finalizes; at interpreter exit the modules finalize uses
        # may already be torn down, and there is nothing left to release then anyway
        try:
            self.finalize()
        except Exception:
            pass

    def finalize(self) -> None:
        """Stop measuring collectives; the last step no longer weights updates (the trainer
        finalizes its iterators when it ends)."""
        global_step.withdraw(id(self))
        unsubscribe = getattr(self, "_unsubscribe", None)  # absent if __init__ raised
        if unsubscribe is not None:
            unsubscribe()
            self._unsubscribe = None
        readers = getattr(self, "_readers", None)
        if readers is not None:
            readers.shutdown(wait=False)
            self._readers = None


def create_global_batch_iterator(
    dataset: Any,
    batch_size: int,
    comm: CommunicatorBase,
    repeat: bool = True,
    shuffle: bool = True,
    seed: int = 0,
    split: str | Sequence[float] = "even",
    n_threads: int = 1,
) -> GlobalBatchIterator:
    """An iterator over the global batch ``batch_size`` of which each rank gets its part.

    Collective (every rank calls it: lengths, batch and seed are compared in one allgather).
    ``dataset``: the whole dataset, on every rank. ``split``: ``"even"``, ``"speed"`` or one
    positive weight per rank. ``n_threads``: threads reading this rank's examples of each step
    (for datasets whose ``get_example`` loads or decodes, as ``MultithreadIterator``'s; no
    prefetch). See the module docstring and docs/global_batch.md.
    """
    return GlobalBatchIterator(dataset, batch_size, comm, repeat, shuffle, seed, split, n_threads)
