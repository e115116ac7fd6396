"""Iterators that keep ranks in step: one reader broadcasting batches, a shared shuffle order, or
one global batch schedule each rank reads its part of.

Chainer-facing: importing this package imports Chainer. The names are imported eagerly, so
a submodule that shares its function's name (``scatter_dataset``) can never shadow the function.
"""

from __future__ import annotations

from mnify.runtime.iterators.global_batch_iterator import (
    GlobalBatchIterator,
    create_global_batch_iterator,
)
from mnify.runtime.iterators.multi_node_iterator import create_multi_node_iterator
from mnify.runtime.iterators.synchronized_iterator import create_synchronized_iterator

__all__ = [
    "GlobalBatchIterator",
    "create_global_batch_iterator",
    "create_multi_node_iterator",
    "create_synchronized_iterator",
]
