"""What converted scripts import: the ChainerMN API on mpi4py (and CuPy/NCCL on GPUs).

``from mnify import runtime as mn`` gives the same names ChainerMN has
(``mn.create_communicator``, ``mn.create_multi_node_optimizer``, ``mn.scatter_dataset``,
``mn.links.MultiNodeBatchNormalization`` ...) and what mnify adds, e.g. the global batch
(``mn.create_global_batch_iterator``, ``mn.extensions.global_snapshot``,
``mn.load_global_snapshot``: docs/global_batch.md). Names are resolved lazily: the communicators
and kernels never import Chainer, so a GPU machine with numpy 2 and no Chainer can still use
them; only touching a Chainer-facing name (optimizer wrapper, links, functions, iterators,
evaluator) imports Chainer.
"""

from __future__ import annotations

from mnify._lazy import lazy_exports

# public name -> module (relative to this package) that defines it
_NAMES: dict[str, str] = {
    "create_communicator": "communicators",
    "current_communicator": "communicators",
    "CommunicatorBase": "communicators.base",
    "CollectiveTimeout": "errors",
    "CollectiveMismatch": "errors",
    "create_multi_node_optimizer": "optimizers",
    "scatter_dataset": "datasets",
    "scatter_index": "datasets",
    "bcast_dataset": "datasets",
    "create_empty_dataset": "datasets",
    "create_multi_node_evaluator": "extensions",
    "create_multi_node_checkpointer": "extensions",
    "GenericMultiNodeEvaluator": "extensions",
    "LinearWarmup": "extensions",
    "distribute_extensions": "extensions",
    "quiet_on_other_ranks": "extensions",
    "distribute_trainers": "trainers",
    "distribute_trainer": "trainers",
    "rank0_log_files": "log_config",
    "create_multi_node_iterator": "iterators",
    "create_synchronized_iterator": "iterators",
    "create_global_batch_iterator": "iterators",
    "load_global_snapshot": "extensions",
}
_SUBMODULES = frozenset(
    {
        "communicators",
        "datasets",
        "extensions",
        "functions",
        "iterators",
        "kernels",
        "links",
        "optimizers",
        "trainers",
    }
)

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES, _SUBMODULES)
