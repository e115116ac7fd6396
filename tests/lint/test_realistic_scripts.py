"""Whole scripts: canonical correct ones report nothing; the seeds' buggy ones report exactly
their bugs (``# expect: MN123`` markers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mnify.lint import lint_source

SCRIPTS = sorted((Path(__file__).parent / "scripts").glob("*.py"))


def expected(source: str) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(source.splitlines(), start=1):
        match = re.search(r"# expect: (MN\d+)", line)
        if match:
            found.append((number, match[1]))
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_reports_exactly_its_known_hazards(script: Path) -> None:
    source = script.read_text(encoding="utf-8")
    found = lint_source(source, script.name)
    assert [(d.line, d.code) for d in found] == expected(source), [
        f"{d.line}:{d.col} {d.code} {d.message}" for d in found
    ]


def test_the_correct_chainermn_script_also_passes_with_all_but_information_rules() -> None:
    source = (Path(__file__).parent / "scripts" / "chainermn_mnist.py").read_text()
    assert lint_source(source, "chainermn_mnist.py", select=["ALL"], ignore=["MN9"]) == []
