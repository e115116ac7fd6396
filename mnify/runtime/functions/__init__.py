"""Communication as Chainer functions, with backward, for model parallelism (and MNBN's function)."""

from __future__ import annotations

from mnify._lazy import lazy_exports

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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES)
