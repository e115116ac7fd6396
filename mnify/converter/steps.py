"""Every converter step: the rewrites of mnify/rewrites/ and the fixes hazards own in
mnify/hazards/, found by importing both packages (no hand-kept list; docs/design.md §1).

This lives above both packages: a hazard module imports rewrite helpers, so the rewrites
cannot import the hazards to find their fixes.
"""

from __future__ import annotations

import importlib
import pkgutil

import mnify.hazards
import mnify.rewrites
from mnify.rewrites.registry import Rewrite, registered


def load_rewrites() -> list[Rewrite]:
    """Every registered rewrite, in planning order (imports each module of the two packages)."""
    for package in (mnify.rewrites, mnify.hazards):
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
    return registered()


def fixable_codes() -> frozenset[str]:
    """Every lint rule some rewrite fixes."""
    return frozenset(code for r in load_rewrites() for code in r.fixes)
