"""``mnify lint``: distributed-training hazards in Chainer/ChainerMN scripts.

Public API (the converter uses it for its report):
``lint_source(source, path, *, select=None, ignore=None) -> list[Diagnostic]``, and
``lint_wrapper(wrapper, path, ...)`` to lint a ``libcst.metadata.MetadataWrapper`` whose metadata
the caller already resolved. ``ALL_RULES`` lists the rule classes (code, name, docs, examples),
one module each in mnify/hazards/ over the program model of mnify/program/.

The names are resolved on first use (``mnify._lazy``), so importing one submodule (the
formatters, the diagnostics) does not import every hazard.
"""

from __future__ import annotations

from mnify._lazy import lazy_exports

# public name -> module (relative to this package) that defines it
_NAMES: dict[str, str] = {
    "ALL_RULES": "registry",
    "Diagnostic": "diagnostic",
    "LintSyntaxError": "diagnostic",
    "SelectorError": "registry",
    "lint_source": "runner",
    "lint_wrapper": "runner",
    "parse_project": "runner",
    "project_collectives": "runner",
    "rule_for": "registry",
    "select_rules": "registry",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES)
