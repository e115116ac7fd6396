"""Splitting a dataset among ranks, or handing all of it to every rank.

Chainer-facing: importing this package imports Chainer. The names are imported eagerly, so
a submodule that shares its function's name (``scatter_dataset``) can never shadow the function.
"""

from __future__ import annotations

from mnify.runtime.datasets.bcast_dataset import bcast_dataset
from mnify.runtime.datasets.empty_dataset import create_empty_dataset
from mnify.runtime.datasets.scatter_dataset import scatter_dataset, scatter_index

__all__ = ["bcast_dataset", "create_empty_dataset", "scatter_dataset", "scatter_index"]
