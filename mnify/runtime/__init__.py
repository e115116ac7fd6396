"""What converted scripts import: the ChainerMN API on mpi4py (and CuPy/NCCL on GPUs).

``from mnify import runtime as mn`` gives the same names ChainerMN has
(``mn.create_communicator``, ``mn.create_multi_node_optimizer``, ``mn.scatter_dataset``,
``mn.links.MultiNodeBatchNormalization`` ...). Names are resolved lazily: the communicators and
kernels never import Chainer, so a GPU machine with numpy 2 and no Chainer can still use them;
only touching a Chainer-facing name (optimizer wrapper, links, functions, iterators, evaluator)
imports Chainer.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_NAMES: dict[str, str] = {
    "create_communicator": "mnify.runtime.communicators",
    "CommunicatorBase": "mnify.runtime.communicators.base",
    "CollectiveTimeout": "mnify.runtime.errors",
    "CollectiveMismatch": "mnify.runtime.errors",
    "create_multi_node_optimizer": "mnify.runtime.optimizers",
    "scatter_dataset": "mnify.runtime.datasets",
    "scatter_index": "mnify.runtime.datasets",
    "create_empty_dataset": "mnify.runtime.datasets",
    "create_multi_node_evaluator": "mnify.runtime.extensions",
    "create_multi_node_checkpointer": "mnify.runtime.extensions",
    "create_multi_node_iterator": "mnify.runtime.iterators",
    "create_synchronized_iterator": "mnify.runtime.iterators",
}
_SUBMODULES = {
    "communicators",
    "datasets",
    "extensions",
    "functions",
    "iterators",
    "kernels",
    "links",
    "optimizers",
}

__all__ = sorted(_NAMES) + sorted(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"mnify.runtime.{name}")
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'mnify.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
