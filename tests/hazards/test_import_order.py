"""Hazard modules import the rule base and rewrite helpers while lint's registry and the rewrite
registry import every hazard module: whichever of them a fresh interpreter imports first, the
packages load completely (mnify/lint/__init__ and mnify/rewrites/__init__ resolve their names
lazily for this)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_IMPORTS = [
    "mnify.hazards.mn503_optimizer_not_multi_node",
    "mnify.hazards.registry",
    "mnify.hazards.rule",
    "mnify.lint.registry",
    "mnify.rewrites.context",
    "mnify.rewrites.registry",
    "mnify.converter.driver",
    "mnify.program.context",
]
CHECK = (
    "import mnify.lint, mnify.rewrites\n"
    "from mnify.converter.steps import load_rewrites\n"
    "steps = {s.step for s in load_rewrites()}\n"
    "assert mnify.lint.rule_for('MN503').code == 'MN503'\n"
    "assert {'optimizer', 'dataset'} <= steps, steps\n"
    "import mnify.converter\n"
    "assert callable(mnify.converter.convert_source)\n"
)


@pytest.mark.parametrize("first", FIRST_IMPORTS)
def test_any_module_can_be_imported_first(first: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", f"import {first}\n{CHECK}"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
