"""Splitting a dataset among ranks."""

from __future__ import annotations

from mnify._lazy import lazy_exports

# public name -> module (relative to this package) that defines it; imported on first use
_NAMES: dict[str, str] = {
    "scatter_dataset": "scatter_dataset",
    "scatter_index": "scatter_dataset",
    "create_empty_dataset": "empty_dataset",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES)
