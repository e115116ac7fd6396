"""Lazy module attributes: a package names what it exports and where, imports on first use.

The runtime's facades use this so that ``from mnify import runtime as mn`` costs nothing and never
imports Chainer until a Chainer-facing name is touched.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, names: dict[str, str], submodules: frozenset[str] = frozenset()
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``.

    ``names`` maps an exported name to the submodule (relative to ``package``) that defines it;
    ``submodules`` are exported as modules themselves.
    """
    exported = sorted(names) + sorted(submodules)

    def getattr_(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        # Cache it: later lookups skip __getattr__, and the binding cannot be changed later.
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return exported

    return getattr_, dir_, exported
