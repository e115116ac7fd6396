"""Every rule (one module each in mnify/hazards/), in code order, and the ruff-style selection
of which ones run.

Selectors are ``ALL``, a code prefix (``MN``, ``MN3``, ``MN30``) or a full code (``MN8xx`` belong
to ``mnify convert``'s report and select no lint rule). A rule runs when
the most specific selector that matches it comes from ``select``/``extend-select`` rather than
``ignore`` (on a tie, ``ignore`` wins). Without ``select`` the default set is every rule whose
``default_enabled`` is true; information rules (MN9xx) run only when a selector names them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from mnify.hazards.registry import discover_rules
from mnify.hazards.rule import Rule

# One module per hazard under mnify/hazards/, found there (no hand-kept list).
ALL_RULES: tuple[type[Rule], ...] = discover_rules()
RULES_BY_CODE: dict[str, type[Rule]] = {rule.code: rule for rule in ALL_RULES}
_SELECTOR = re.compile(r"^(ALL|MN[0-9]{0,3})$")
# MN8xx are `mnify convert`'s report codes: accepted (a shared [tool.mnify] may name them) and
# matching no lint rule.
_CONVERT = "MN8"


class SelectorError(ValueError):
    """A selector that is not ALL, a known code or a prefix of one."""


def rule_for(code_or_name: str) -> type[Rule] | None:
    """Look a rule up by code (``MN301``) or name (``collective-on-some-ranks``)."""
    wanted = code_or_name.strip()
    found = RULES_BY_CODE.get(wanted.upper())
    if found is not None:
        return found
    return next((rule for rule in ALL_RULES if rule.name == wanted.lower()), None)


def split_selectors(values: Iterable[str] | None) -> list[str]:
    """``["MN1,MN2", "MN301"]`` -> ``["MN1", "MN2", "MN301"]``, upper-cased, validated."""
    result: list[str] = []
    for value in values or ():
        for part in value.split(","):
            selector = part.strip().upper()
            if not selector:
                continue
            known = any(_matches(selector, rule.code) for rule in ALL_RULES)
            if not _SELECTOR.match(selector) or not (known or selector.startswith(_CONVERT)):
                raise SelectorError(f"unknown rule selector '{part.strip()}'")
            result.append(selector)
    return result


def _matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def _specificity(selector: str) -> int:
    return 0 if selector == "ALL" else len(selector)


def select_rules(
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    extend_select: Sequence[str] | None = None,
) -> list[type[Rule]]:
    """The rules to run, in code order (see the module docstring for the semantics)."""
    chosen = split_selectors(select) if select is not None else None
    extra = split_selectors(extend_select)
    dropped = split_selectors(ignore)
    result = []
    for rule in ALL_RULES:
        enabled_by = [s for s in (chosen or []) + extra if _matches(s, rule.code)]
        if chosen is None and rule.default_enabled:
            enabled_by.append("ALL")
        if not enabled_by:
            continue
        best_on = max(_specificity(s) for s in enabled_by)
        disabled_by = [s for s in dropped if _matches(s, rule.code)]
        if disabled_by and max(_specificity(s) for s in disabled_by) >= best_on:
            continue
        result.append(rule)
    return result
