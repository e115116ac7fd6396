"""Iterators that keep ranks in step: one reader broadcasting batches, or a shared shuffle order."""

from __future__ import annotations

from mnify._lazy import lazy_exports

# public name -> module (relative to this package) that defines it; imported on first use
_NAMES: dict[str, str] = {
    "create_multi_node_iterator": "multi_node_iterator",
    "create_synchronized_iterator": "synchronized_iterator",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES)
