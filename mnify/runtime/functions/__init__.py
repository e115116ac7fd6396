"""Communication as Chainer functions, with backward, for model parallelism (and MNBN's function).

Chainer-facing: importing this package imports Chainer. The names are imported eagerly, so
a submodule that shares its function's name (``scatter_dataset``) can never shadow the function.
"""

from __future__ import annotations

from mnify.runtime.functions.batch_normalization import multi_node_batch_normalization
from mnify.runtime.functions.collective_communication import (
    allgather,
    allreduce,
    alltoall,
    bcast,
    gather,
    scatter,
)
from mnify.runtime.functions.point_to_point_communication import recv, send
from mnify.runtime.functions.pseudo_connect import pseudo_connect

__all__ = [
    "allgather",
    "allreduce",
    "alltoall",
    "bcast",
    "gather",
    "multi_node_batch_normalization",
    "pseudo_connect",
    "recv",
    "scatter",
    "send",
]
