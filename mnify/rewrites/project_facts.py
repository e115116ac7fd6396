"""Facts about the project that no single file knows, shared with every file before planning.

A model class imported from a sibling file that is not converted may hold BatchNormalization
(``FileContext.external_bn``); an evaluator subclass in one file may extend an evaluator class
defined in another (``FileContext.project_evaluators``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from mnify.rewrites import evaluator
from mnify.rewrites.context import FileContext


def share_project_facts(contexts: Mapping[str, FileContext], paths: Iterable[str]) -> None:
    """Give every file the project's BatchNormalization peek and evaluator classes."""
    converted = {ctx.module_name for ctx in contexts.values()}
    peek = _peek_bn_factory(list(paths), converted)
    for ctx in contexts.values():
        ctx.external_bn = peek
    found: dict[str, bool] = {}
    for _ in range(3):  # a subclass in one file of an evaluator in another
        for ctx in contexts.values():
            ctx.project_evaluators = dict(found)
        grown: dict[str, bool] = {}
        for ctx in contexts.values():
            grown.update(evaluator.project_evaluators(ctx))
        if grown == found:
            break
        found = grown
    for ctx in contexts.values():
        ctx.project_evaluators = found


def _peek_bn_factory(paths: list[str], converted: set[str]) -> Callable[[str], bool]:
    """Whether a class imported from a sibling module that is NOT converted uses BN."""
    cache: dict[Path, bool] = {}

    def peek(qname: str) -> bool:
        parts = qname.lstrip(".").split(".")
        if len(parts) < 2 or parts[-2] in converted:
            return False
        for p in paths:
            candidate = Path(p).parent / (parts[-2] + ".py")
            if candidate not in cache:
                try:
                    text = candidate.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    text = ""
                cls = re.search(rf"^class\s+{re.escape(parts[-1])}\b", text, re.M)
                cache[candidate] = bool(cls) and "BatchNormalization" in text
            if cache[candidate]:
                return True
        return False

    return peek
