"""Communication as Chainer functions, with backward, for model parallelism (and MNBN's function)."""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module (relative to this package) that defines it; imported on first use
_NAMES: dict[str, str] = {
    "allgather": "collective_communication",
    "alltoall": "collective_communication",
    "bcast": "collective_communication",
    "gather": "collective_communication",
    "scatter": "collective_communication",
    "allreduce": "collective_communication",
    "send": "point_to_point_communication",
    "recv": "point_to_point_communication",
    "pseudo_connect": "pseudo_connect",
    "multi_node_batch_normalization": "batch_normalization",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return __all__
