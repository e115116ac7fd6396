"""Chainer links that communicate: synchronised batch norm, channel-parallel convolution, spatially parallel models, layer-wise model splits.

Chainer-facing: importing this package imports Chainer. The names are imported eagerly, so
a submodule that shares its function's name (``scatter_dataset``) can never shadow the function.
"""

from __future__ import annotations

from mnify.runtime.links.batch_normalization import MultiNodeBatchNormalization
from mnify.runtime.links.create_channel_parallel_model import create_channel_parallel_model
from mnify.runtime.links.create_mnbn_model import create_mnbn_model
from mnify.runtime.links.create_spatial_parallel_model import create_spatial_parallel_model
from mnify.runtime.links.multi_node_chain_list import MultiNodeChainList
from mnify.runtime.links.parallel_convolution import ParallelConvolution2D

__all__ = [
    "MultiNodeBatchNormalization",
    "MultiNodeChainList",
    "ParallelConvolution2D",
    "create_channel_parallel_model",
    "create_mnbn_model",
    "create_spatial_parallel_model",
]
