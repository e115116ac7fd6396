"""Every fixture file: the rule fires exactly on its ``# error`` lines, never on ``# ok`` ones."""

from __future__ import annotations

import pytest

from mnify.lint import ALL_RULES, lint_source
from tests.lint.fixtures import Fixture, all_fixtures

FIXTURES = all_fixtures()


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.path.name for f in FIXTURES])
def test_fixture(fixture: Fixture) -> None:
    source = fixture.path.read_text(encoding="utf-8")
    found = lint_source(source, fixture.path.name, select=[fixture.code])
    lines = sorted(d.line for d in found)
    assert sorted(fixture.errors) == lines, "\n".join(
        f"{d.line}:{d.col} {d.code} {d.message}" for d in found
    )
    assert not fixture.oks & set(lines)
    assert all(d.code == fixture.code for d in found)


def test_every_rule_has_positive_and_negative_fixture_cases() -> None:
    for rule in ALL_RULES:
        mine = [f for f in FIXTURES if f.code == rule.code]
        assert any(f.path.stem == rule.code for f in mine), f"fixtures/lint/{rule.code}.py missing"
        assert any(f.errors for f in mine), f"{rule.code}: no `# error` case"
        assert any(f.oks for f in mine), f"{rule.code}: no `# ok` near miss"


def test_every_fixture_belongs_to_a_rule() -> None:
    codes = {rule.code for rule in ALL_RULES}
    assert {f.code for f in FIXTURES} <= codes
