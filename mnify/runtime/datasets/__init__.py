"""Splitting a dataset among ranks.

Chainer-facing: importing this package imports Chainer. The names are imported eagerly, so
a submodule that shares its function's name (``scatter_dataset``) can never shadow the function.
"""

from __future__ import annotations

from mnify.runtime.datasets.empty_dataset import create_empty_dataset
from mnify.runtime.datasets.scatter_dataset import scatter_dataset, scatter_index

__all__ = ["create_empty_dataset", "scatter_dataset", "scatter_index"]
