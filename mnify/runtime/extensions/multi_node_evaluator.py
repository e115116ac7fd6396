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
"""

from __future__ import annotations

import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import chainer

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


class CountingIterator:
    """Wraps a dataset iterator and remembers the size of the batch it returned last."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.last_batch_size = 0
        self.examples = 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        dataset = getattr(self.inner, "dataset", None)
        if dataset is not None and len(dataset) == 0:
            # An empty shard (fewer test examples than ranks): Chainer's iterators divide by
            # the dataset length, so end the evaluation here instead.
            raise StopIteration
        batch = next(self.inner)
        self.last_batch_size = len(batch)
        self.examples += self.last_batch_size
        return batch

    next = __next__

    def reset(self) -> None:
        self.inner.reset()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


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
    the ranks that reported them.
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
        for key, (weighted, weight, plain, count) in sorted(totals.items())
    }


def _multi_node_evaluate(self: Any) -> dict[str, float]:
    """Run the wrapped evaluator's evaluate with example counting, then combine over the ranks."""
    comm: CommunicatorBase = self._mn_communicator
    iterators = getattr(self, "_iterators", {})
    if "main" not in iterators:  # nothing to count: ChainerMN's equal weights
        local_means = self._mn_original_evaluate()
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
    return combine_rank_means(comm.allgather_obj(local))


def _as_float(value: Any) -> float:
    """A reported scalar (Variable, numpy/CuPy 0-d array, Python number) as a float."""
    if isinstance(value, chainer.Variable):
        value = value.array
    return float(value)


def create_multi_node_evaluator(actual_evaluator: Any, communicator: CommunicatorBase) -> Any:
    """Make ``actual_evaluator`` (e.g. ``extensions.Evaluator``) report means over all ranks.

    Every rank must run it (it communicates once per evaluation). The evaluator is patched in
    place and returned, so its name, trigger and priority stay as they were.
    """
    actual_evaluator._mn_original_evaluate = actual_evaluator.evaluate
    actual_evaluator._mn_communicator = communicator
    actual_evaluator.evaluate = types.MethodType(_multi_node_evaluate, actual_evaluator)
    return actual_evaluator
