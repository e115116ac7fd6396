"""Every rule is complete: unique code and name, documented, and its own examples behave."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mnify.hazards.registry import hazard_module_name
from mnify.hazards.rule import Rule
from mnify.lint import ALL_RULES, lint_source
from mnify.lint.docs import EXAMPLE_IMPORTS, render_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_codes_and_names_are_unique_and_well_formed() -> None:
    codes = [rule.code for rule in ALL_RULES]
    names = [rule.name for rule in ALL_RULES]
    assert len(set(codes)) == len(codes)
    assert len(set(names)) == len(names)
    assert codes == sorted(codes)
    for rule in ALL_RULES:
        assert re.fullmatch(r"MN[1-9][0-9]{2}", rule.code)
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
        assert rule.__module__ == f"mnify.hazards.{hazard_module_name(rule)}", rule


@pytest.mark.parametrize("rule", ALL_RULES, ids=[r.code for r in ALL_RULES])
def test_rule_is_documented(rule: type[Rule]) -> None:
    assert len(rule.condition()) > 60, "the docstring must state the precise firing condition"
    assert rule.summary and not rule.summary.endswith(".")
    assert len(rule.why) > 60
    assert rule.bad.strip() and rule.good.strip() and rule.bad != rule.good


@pytest.mark.parametrize("rule", ALL_RULES, ids=[r.code for r in ALL_RULES])
def test_bad_example_fires_and_good_example_does_not(rule: type[Rule]) -> None:
    bad = lint_source(EXAMPLE_IMPORTS + rule.bad, "bad.py", select=[rule.code])
    good = lint_source(EXAMPLE_IMPORTS + rule.good, "good.py", select=[rule.code])
    assert [d.code for d in bad] and {d.code for d in bad} == {rule.code}
    assert good == []


def test_only_information_rules_are_off_by_default() -> None:
    for rule in ALL_RULES:
        assert rule.default_enabled == (not rule.code.startswith("MN9")), rule.code


def test_docs_rules_md_is_up_to_date() -> None:
    written = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert written == render_markdown(ALL_RULES), (
        "docs/rules.md is stale: run `mnify rules --format markdown > docs/rules.md`"
    )
