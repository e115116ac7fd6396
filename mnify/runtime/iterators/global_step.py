"""The training step a global-batch iterator handed out last: how the global batch was split.

The global-batch iterator (:mod:`.global_batch_iterator`) records each step it hands out while
training (``chainer.config.train`` true); the multi-node optimizer reads it to weight this
rank's loss by ``size * n_r / N`` (``n_r`` this rank's share, ``N`` the global batch), which makes
any split of the global batch give one process's mean gradient (docs/global_batch.md).

Why a module-level record and not an argument: Chainer's ``StandardUpdater`` (and custom
updaters, GAN updaters updating two optimizers from one batch) call ``iterator.next()`` and then
``optimizer.update(lossfun, *arrays)`` with nothing linking the two. Evaluation does not
overwrite the record: Chainer's Evaluator iterates under ``train=False``, and an iterator that
runs out (``repeat=False``) or is reset withdraws its own record.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GlobalStep:
    """One step of a global-batch schedule as seen by one rank.

    ``shares[r]`` examples of the ``global_batch`` went to rank ``r`` (they sum to it);
    ``owner`` is the id of the iterator that made it (so it can withdraw it).
    """

    iteration: int
    global_batch: int
    shares: tuple[int, ...]
    rank: int
    owner: int

    @property
    def size(self) -> int:
        return len(self.shares)

    @property
    def share(self) -> int:
        """This rank's number of examples in the step."""
        return self.shares[self.rank]

    @property
    def loss_weight(self) -> float:
        """``size * n_r / N``: the factor on this rank's batch-mean loss that, after the
        gradient mean over ranks, weighs every example of the global batch by ``1 / N``."""
        if self.global_batch == 0:
            return 0.0
        return self.size * self.share / self.global_batch


_latest: GlobalStep | None = None


def record(step: GlobalStep) -> None:
    """The iterator handed out ``step`` for training."""
    global _latest
    _latest = step


def withdraw(owner: int) -> None:
    """The iterator ``owner`` ran out or was reset: its last step no longer describes a batch."""
    global _latest
    if _latest is not None and _latest.owner == owner:
        _latest = None


def latest(size: int, rank: int) -> GlobalStep | None:
    """The step to weight the next update by, if one was recorded for this world."""
    step = _latest
    if step is None or step.size != size or step.rank != rank:
        return None
    return step


_micro_batches = 1


def set_micro_batches(count: int) -> None:
    """How many micro-batches the current step accumulates before its one gradient all-reduce
    (``GrowBatch(max_per_rank=...)``; 1 otherwise): the timeline records it with the update."""
    global _micro_batches
    _micro_batches = int(count)


def micro_batches() -> int:
    return _micro_batches
