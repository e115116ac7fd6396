"""Trainer extensions that aggregate over ranks, the linear-scaling warm-up, and the
world-size-independent snapshot.

Chainer-facing: importing this package imports Chainer. The names are imported eagerly, so
a submodule that shares its function's name (``scatter_dataset``) can never shadow the function.
"""

from __future__ import annotations

from mnify.runtime.extensions.checkpoint import create_multi_node_checkpointer
from mnify.runtime.extensions.distribute import distribute_extensions
from mnify.runtime.extensions.generic_evaluator import GenericMultiNodeEvaluator
from mnify.runtime.extensions.global_snapshot import (
    GlobalSnapshot,
    global_snapshot,
    load_global_snapshot,
)
from mnify.runtime.extensions.grow_batch import GrowBatch
from mnify.runtime.extensions.multi_node_evaluator import create_multi_node_evaluator
from mnify.runtime.extensions.quiet import quiet_on_other_ranks
from mnify.runtime.extensions.warmup import LinearWarmup

__all__ = [
    "GenericMultiNodeEvaluator",
    "GlobalSnapshot",
    "GrowBatch",
    "LinearWarmup",
    "create_multi_node_checkpointer",
    "create_multi_node_evaluator",
    "distribute_extensions",
    "global_snapshot",
    "load_global_snapshot",
    "quiet_on_other_ranks",
]
