"""Chainer links that communicate: synchronised batch norm, channel-parallel convolution, layer-wise model splits."""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module (relative to this package) that defines it; imported on first use
_NAMES: dict[str, str] = {
    "MultiNodeBatchNormalization": "batch_normalization",
    "create_mnbn_model": "create_mnbn_model",
    "ParallelConvolution2D": "parallel_convolution",
    "MultiNodeChainList": "multi_node_chain_list",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return __all__
