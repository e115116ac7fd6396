"""Chainer links that communicate: synchronised batch norm, channel-parallel convolution, layer-wise model splits."""

from __future__ import annotations

from mnify._lazy import lazy_exports

# public name -> module (relative to this package) that defines it; imported on first use
_NAMES: dict[str, str] = {
    "MultiNodeBatchNormalization": "batch_normalization",
    "create_mnbn_model": "create_mnbn_model",
    "ParallelConvolution2D": "parallel_convolution",
    "MultiNodeChainList": "multi_node_chain_list",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES)
