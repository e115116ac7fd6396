"""Trainer extensions that aggregate over ranks."""

from __future__ import annotations

from mnify._lazy import lazy_exports

# public name -> module (relative to this package) that defines it; imported on first use
_NAMES: dict[str, str] = {
    "create_multi_node_evaluator": "multi_node_evaluator",
    "create_multi_node_checkpointer": "checkpoint",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES)
