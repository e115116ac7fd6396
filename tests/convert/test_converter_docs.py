"""The converter's MN8xx steps are documented like the lint rules: docs/converter.md is generated
from the rewrite registry, and ``mnify explain`` / ``mnify rules --converter`` show the steps."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from mnify.cli import main
from mnify.converter.docs import render_markdown, step_doc
from mnify.converter.steps import load_rewrites
from mnify.lint.registry import rule_for

ROOT = Path(__file__).resolve().parents[2]


def test_docs_converter_md_is_up_to_date() -> None:
    written = (ROOT / "docs" / "converter.md").read_text(encoding="utf-8")
    assert written == render_markdown(), (
        "docs/converter.md is stale: run `mnify rules --converter --format markdown "
        "> docs/converter.md`"
    )


def test_every_step_has_its_own_mn8_code_and_a_documented_module() -> None:
    steps = load_rewrites()
    codes = [s.own_code for s in steps]
    assert len(codes) == len(set(codes))
    for step in steps:
        assert re.fullmatch(r"MN8\d\d", step.own_code), step
        assert len(step_doc(step).split()) >= 20, f"{step.step}: its module docstring says little"
        for code in step.fixes:
            assert rule_for(code) is not None, f"{step.step} fixes unknown rule {code}"


def test_explain_shows_a_converter_step_and_rules_lists_them() -> None:
    runner = CliRunner()
    shown = runner.invoke(main, ["explain", "MN803"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[0] == "# MN803 `optimizer`"
    listed = runner.invoke(main, ["rules", "--converter", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [r["code"] for r in rows] == [s.own_code for s in load_rewrites()]
    unknown = runner.invoke(main, ["explain", "MN899"])
    assert unknown.exit_code == 2
