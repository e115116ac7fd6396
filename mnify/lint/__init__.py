"""``mnify lint``: distributed-training hazards in Chainer/ChainerMN scripts.

Public API (the converter uses it for its report):
``lint_source(source, path, *, select=None, ignore=None) -> list[Diagnostic]``, and
``lint_wrapper(wrapper, path, ...)`` to lint a ``libcst.metadata.MetadataWrapper`` whose metadata
the caller already resolved. ``ALL_RULES`` lists the rule classes (code, name, docs, examples).
"""

from __future__ import annotations

from mnify.lint.diagnostic import Diagnostic, LintSyntaxError
from mnify.lint.registry import ALL_RULES, SelectorError, rule_for, select_rules
from mnify.lint.rule import Rule
from mnify.lint.runner import lint_source, lint_wrapper, parse_project, project_collectives

__all__ = [
    "ALL_RULES",
    "Diagnostic",
    "LintSyntaxError",
    "Rule",
    "SelectorError",
    "lint_source",
    "lint_wrapper",
    "parse_project",
    "project_collectives",
    "rule_for",
    "select_rules",
]
