"""The multi-node evaluator: an Evaluator whose results are means over every rank's examples.

ChainerMN's version averages the ranks' means with equal weight, which is wrong whenever the
ranks evaluate different numbers of examples (``scatter_dataset(..., force_equal_length=False)``
for an exact test split, or a last batch that is short on some ranks). Here each reported value
is weighted by the number of examples it was computed on:

* within a rank, each batch's observation counts with the batch's size (Chainer's own Evaluator
  gives every batch the same weight, so a short last batch would count as much as a full one);
* over the ranks, the rank means are combined weighted by those example counts, in one
  ``allgather_obj``, so ranks that reported different keys (an empty shard reports nothing)
  cannot make a collective hang.

Result: the mean over all evaluated examples, as one process evaluating the whole test set
would report it with its model's per-batch means. An evaluator that overrides ``evaluate`` and
never calls ``eval_func`` is weighted by how many examples it drew from its main iterator.

Iterators without ``reset()`` (a user's class) are copied with ``copy.copy`` for each
evaluation, as Chainer's own Evaluator does. ``gather=True`` selects the gathering evaluator for
metrics that are not means (:mod:`mnify.runtime.extensions.gathered_evaluator`).
"""

from __future__ import annotations

import copy
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import chainer

from mnify.runtime.extensions.gathered_evaluator import dataset_is_empty, gathered_evaluate

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


class _Counts:
    """Shared by a counting iterator and its shallow copies (``copy.copy(it)`` in evaluate)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.last_batch_size = 0
        self.examples = 0


class CountingIterator:
    """Wraps a dataset iterator and remembers the size of the batch it returned last.

    ``reset()`` resets the wrapped iterator or, for an iterator without ``reset()`` (a user's
    class), starts over from a ``copy.copy`` of it, as Chainer's Evaluator does: the original is
    never advanced, so every evaluation sees the whole shard.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._counts = _Counts(inner)

    @property
    def last_batch_size(self) -> int:
        return self._counts.last_batch_size

    @property
    def examples(self) -> int:
        return self._counts.examples

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        counts = self._counts
        if dataset_is_empty(counts.source):
            # An empty shard (fewer test examples than ranks): Chainer's iterators divide by
            # the dataset length, so end the evaluation here instead.
            raise StopIteration
        step = getattr(counts.source, "__next__", None) or counts.source.next
        batch = step()
        while len(batch) == 0:
            # a global-batch iterator's empty share (a last batch smaller than the number of
            # ranks): nothing to convert or report; the next call ends the evaluation with
            # everyone else's
            batch = step()
        counts.last_batch_size = len(batch)
        counts.examples += counts.last_batch_size
        return batch

    next = __next__

    def reset(self) -> None:
        if hasattr(self.inner, "reset"):
            self.inner.reset()
            self._counts.source = self.inner
        else:
            self._counts.source = copy.copy(self.inner)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "_counts"):
            raise AttributeError(name)
        return getattr(self._counts.source, name)


def _weight_observations(
    eval_func: Callable[..., Any], counter: CountingIterator, weights: dict[str, float]
) -> Callable[..., Any]:
    """``eval_func`` that marks what it reports with the batch size as the summary weight."""

    def weighted(*args: Any, **kwargs: Any) -> Any:
        result = eval_func(*args, **kwargs)
        observation = chainer.reporter.get_current_reporter().observation
        for key, value in list(observation.items()):
            if isinstance(value, tuple):  # the model gave its own weight: keep it
                weights[key] += float(value[1])
                continue
            observation[key] = (value, counter.last_batch_size)
            weights[key] += counter.last_batch_size
        return result

    return weighted


def combine_rank_means(per_rank: list[dict[str, tuple[float, float]]]) -> dict[str, float]:
    """``{key: (mean, weight)}`` of every rank -> the weighted mean of each key over the ranks.

    Keys whose weights are all zero (an evaluator that told us nothing) get the plain mean of
    the ranks that reported them. Keys keep the order the evaluator reported them in (rank 0's
    first), as one process's evaluator does: a report printed from them reads the same.
    """
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for results in per_rank:
        for key, (mean, weight) in results.items():
            entry = totals[key]
            entry[0] += mean * weight
            entry[1] += weight
            entry[2] += mean
            entry[3] += 1
    return {
        key: (weighted / weight if weight > 0 else plain / count)
        for key, (weighted, weight, plain, count) in totals.items()
    }


def _multi_node_evaluate(self: Any) -> dict[str, float]:
    """Run the wrapped evaluator's evaluate with example counting, then combine over the ranks."""
    comm: CommunicatorBase = self._mn_communicator
    iterators = getattr(self, "_iterators", {})
    if "main" not in iterators:  # nothing to count: ChainerMN's equal weights
        local_means = self._mn_original_evaluate()
        comm.barrier()  # untimed: shards of different sizes take different times
        return combine_rank_means(
            comm.allgather_obj({k: (_as_float(v), 0.0) for k, v in local_means.items()})
        )
    original_iterator = iterators["main"]
    original_eval_func = self.eval_func
    counter = CountingIterator(original_iterator)
    weights: dict[str, float] = defaultdict(float)
    iterators["main"] = counter
    self.eval_func = _weight_observations(
        original_eval_func or self._targets["main"], counter, weights
    )
    try:
        local_means = self._mn_original_evaluate()
    finally:
        iterators["main"] = original_iterator
        self.eval_func = original_eval_func
    local = {
        key: (_as_float(value), weights.get(key) or float(counter.examples))
        for key, value in local_means.items()
    }
    comm.barrier()  # untimed: shards of different sizes take different times
    return combine_rank_means(comm.allgather_obj(local))


def _as_float(value: Any) -> float:
    """A reported scalar (Variable, numpy/CuPy 0-d array, Python number) as a float."""
    if isinstance(value, chainer.Variable):
        value = value.array
    return float(value)


def create_multi_node_evaluator(
    actual_evaluator: Any, communicator: CommunicatorBase, gather: bool = False
) -> Any:
    """Make ``actual_evaluator`` (e.g. ``extensions.Evaluator``) report over all ranks' shards.

    Without ``gather`` (ChainerMN's behaviour, weighted by examples): every rank evaluates its
    shard and the reported means are combined. That is right for means over examples (loss,
    accuracy) only. With ``gather=True`` (mnify only; for mAP, mIoU, ROC-AUC, BLEU or any
    ``evaluate()`` override): every rank runs the evaluator's own ``evaluate()`` on its shard,
    what it drew and what the model answered go to rank 0, which computes the metric over the
    whole test set, and every rank returns that (see :mod:`.gathered_evaluator`).

    Every rank must run it (it communicates once per evaluation). The evaluator is patched in
    place and returned, so its name, trigger and priority stay as they were; wrapping it again
    replaces the earlier wrapping instead of stacking a second one.
    """
    if gather and not (
        hasattr(actual_evaluator, "_iterators") and hasattr(actual_evaluator, "_targets")
    ):
        raise TypeError(
            "create_multi_node_evaluator(..., gather=True) needs a "
            "chainer.training.extensions.Evaluator (or a subclass); got "
            f"{type(actual_evaluator).__name__}: use GenericMultiNodeEvaluator instead"
        )
    if "_mn_original_evaluate" not in vars(actual_evaluator):
        actual_evaluator._mn_original_evaluate = actual_evaluator.evaluate
    actual_evaluator._mn_communicator = communicator
    method = gathered_evaluate if gather else _multi_node_evaluate
    actual_evaluator.evaluate = types.MethodType(method, actual_evaluator)
    return actual_evaluator
