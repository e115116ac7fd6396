"""Make a Trainer's registered extensions data-parallel after the fact.

A script often registers its extensions in a helper (``add_extensions(trainer, model,
test_iter, args)``) that has no communicator, and ``mnify convert`` changes no signature. So the
conversion happens where the helper is called, on what it registered: the evaluators become
multi-node evaluators, and on ranks other than 0 the extensions that write or print are dropped
(a ``LogReport`` stays, without its file, so ``trainer.get_extension('LogReport').log`` still
works everywhere). Every rank must call it, after the helper and before ``trainer.run()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chainer.training import extensions as chainer_extensions
from chainer.training.extensions import _snapshot

from mnify.runtime.extensions.multi_node_evaluator import create_multi_node_evaluator

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

# Extensions that only write files or print: rank 0's.
RANK0_ONLY: tuple[type, ...] = (
    chainer_extensions.PrintReport,
    chainer_extensions.ProgressBar,
    chainer_extensions.PlotReport,
    chainer_extensions.DumpGraph,
    chainer_extensions.VariableStatisticsPlot,
    _snapshot._Snapshot,
)


def _overrides_evaluate(evaluator: Any) -> bool:
    """A subclass with its own ``evaluate()`` computes a metric that may not be a mean: gather."""
    return type(evaluator).evaluate is not chainer_extensions.Evaluator.evaluate


def distribute_extensions(trainer: Any, comm: CommunicatorBase) -> Any:
    """Convert ``trainer``'s registered extensions for ``comm`` (see the module docs); returns
    ``trainer``. Idempotent: an evaluator converted before is converted the same way again."""
    entries = trainer._extensions
    for name, entry in list(entries.items()):
        extension = entry.extension
        if isinstance(extension, chainer_extensions.Evaluator):
            original = vars(extension).get("_mn_original_evaluate")
            gather = (
                _overrides_evaluate(extension)
                if original is None
                else getattr(original, "__func__", None)
                is not chainer_extensions.Evaluator.evaluate
            )
            create_multi_node_evaluator(extension, comm, gather=gather)
        elif comm.rank != 0:
            if isinstance(extension, chainer_extensions.LogReport):
                extension._log_name = None  # keep the log in memory, write no file
            elif isinstance(extension, RANK0_ONLY):
                del entries[name]
    return trainer
