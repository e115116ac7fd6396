"""``GenericMultiNodeEvaluator``: ChainerMN 7's evaluator for metrics that are not means.

Same API as ChainerMN 7.8.1's ``chainermn.extensions.GenericMultiNodeEvaluator``: subclass it,
override ``calc_local(*args, **kwargs)`` (run on every rank for each batch of its shard, on
what the converter made of the batch; the default calls the target) and ``aggregate(results)``
(run once, on the root rank, over every rank's ``calc_local`` results; the default returns
them). Differences, all additive:

* ``aggregate``'s observation is reported on **every** rank, so a trainer's ``LogReport`` and
  ``EarlyStoppingTrigger`` see the same value everywhere: a dict it returns is reported under
  the evaluator's name (``{'map': m}`` -> ``validation/map``), and what it reports itself with
  ``chainer.report(values, self.get_target('main'))`` arrives as ``validation/main/...``.
  ``__call__`` returns ``aggregate``'s value on the root and None elsewhere, as ChainerMN does.
* The results reach ``aggregate`` in rank order, each rank's in its own order: with
  ``scatter_dataset``'s contiguous shards, the order of the unscattered test set.
* Local work runs with ``chainer.config.train = False`` (as Chainer's Evaluator does) and
  without back-propagation; ranks may hold different numbers of batches; they meet in untimed
  barriers before the gather and the broadcast, so the watchdog never fires on the wait.
* Iterators without ``reset()`` are copied with ``copy.copy`` for each evaluation.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import chainer
from chainer.dataset import convert
from chainer.training import extension

from mnify.runtime.extensions._host import from_wire, to_host, to_wire
from mnify.runtime.extensions.gathered_evaluator import dataset_is_empty

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


def _convert(converter: Any, batch: Any, device: Any) -> Any:
    call = getattr(convert, "_call_converter", None)
    if call is not None:
        return call(converter, batch, device)
    return converter(batch, device)  # pragma: no cover - Chainer 7 has _call_converter


class GenericMultiNodeEvaluator(extension.Extension):  # type: ignore[misc]
    """Evaluates each rank's shard with ``calc_local``; ``aggregate`` runs on the root over all
    results. See the module docstring.

    Args:
        comm: the communicator (None: a single process, no communication).
        iterator: the test iterator (non-repeating); this rank's shard.
        target: the link to evaluate.
        device: where the converter puts each batch.
        converter: batch -> arrays (``chainer.dataset.concat_examples`` by default).
        root: the rank that aggregates.
        progress_hook: called with each of the root's batches, on the root only.
    """

    trigger = 1, "epoch"
    default_name = "validation"
    priority = extension.PRIORITY_WRITER
    name = None

    def __init__(
        self,
        comm: CommunicatorBase | None,
        iterator: Any,
        target: Any,
        device: Any = None,
        converter: Any = convert.concat_examples,
        root: int = 0,
        **kwargs: Any,
    ) -> None:
        progress_hook = kwargs.pop("progress_hook", None)
        if kwargs:
            raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(kwargs))}")
        size = 1 if comm is None else comm.size
        if not 0 <= root < size:
            raise ValueError(f"root must be a rank of the communicator (0..{size - 1}), got {root}")
        self.comm = comm
        self.iterator = iterator
        self._targets = {"main": target}
        self.converter = converter
        self.device = chainer.get_device(device) if device is not None else None
        self.root = root
        self._progress_hook = progress_hook

    def get_target(self, name: str = "main") -> Any:
        return self._targets[name]

    def calc_local(self, *args: Any, **kwargs: Any) -> Any:
        """One batch of this rank's shard, converted; the default runs the target on it."""
        return self._targets["main"](*args, **kwargs)

    def aggregate(self, results: list[Any]) -> Any:
        """Every rank's ``calc_local`` results (root only); the default returns them."""
        return results

    # ---------------------------------------------------------------------------------------
    def _fresh_iterator(self) -> Any:
        if hasattr(self.iterator, "reset"):
            self.iterator.reset()
            return self.iterator
        return copy.copy(self.iterator)

    def _evaluate_local(self, it: Any) -> Iterator[Any]:
        is_root = self.comm is None or self.comm.rank == self.root
        while not dataset_is_empty(it):
            try:
                batch = it.__next__() if hasattr(it, "__next__") else it.next()
            except StopIteration:
                return
            in_arrays = _convert(self.converter, batch, self.device)
            with chainer.no_backprop_mode():
                if isinstance(in_arrays, tuple):
                    result = self.calc_local(*in_arrays)
                elif isinstance(in_arrays, dict):
                    result = self.calc_local(**in_arrays)
                else:
                    result = self.calc_local(in_arrays)
            if is_root and self._progress_hook is not None:
                self._progress_hook(batch)
            yield result

    def _aggregate_and_observe(self, results: list[Any]) -> tuple[Any, dict[str, Any]]:
        """``aggregate`` under a reporter that names the target like Evaluator does."""
        prefix = "" if self.name is None else self.name + "/"
        reporter = chainer.Reporter()
        for name, target in self._targets.items():
            reporter.add_observer(prefix + name, target)
            if isinstance(target, chainer.Link):
                reporter.add_observers(prefix + name, target.namedlinks(skipself=True))
        with reporter:
            total = self.aggregate(results)
        observation = dict(reporter.observation)
        if isinstance(total, Mapping):
            observation.update({f"{prefix}{key}": value for key, value in total.items()})
        return total, to_host(observation)

    def __call__(self, trainer: Any = None) -> Any:
        it = self._fresh_iterator()
        with chainer.using_config("train", False):
            local = list(self._evaluate_local(it))
            comm = self.comm
            if comm is None or comm.size == 1:
                total, observation = self._aggregate_and_observe(local)
            else:
                comm.barrier()  # untimed: shards take different times
                gathered = comm.gather_obj(to_wire(local), root=self.root)
                total, observation = None, None
                if gathered is not None:
                    results = [r for part in gathered for r in from_wire(part)]
                    total, observation = self._aggregate_and_observe(results)
                comm.barrier()  # untimed: the root aggregates alone
                observation = comm.bcast_obj(observation, root=self.root)
        chainer.report(observation)
        return total
