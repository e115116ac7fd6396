"""Trainer extensions that aggregate over ranks."""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module (relative to this package) that defines it; imported on first use
_NAMES: dict[str, str] = {
    "create_multi_node_evaluator": "multi_node_evaluator",
    "create_multi_node_checkpointer": "checkpoint",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return __all__
