"""The hazard registry (mnify/hazards/registry.py): every hazard module is found, each holds
one rule named like the module, each code has its fixture, and the docstring names the converter
step that fixes it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mnify.converter.steps import load_rewrites
from mnify.hazards.registry import (
    HAZARD_MODULE,
    discover_rules,
    hazard_module_name,
    package_modules,
    rules_defined_in,
)
from mnify.hazards.rule import Rule
from mnify.lint import ALL_RULES

ROOT = Path(__file__).resolve().parents[2]
HAZARD_DIR = ROOT / "mnify" / "hazards"


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def test_every_hazard_module_is_registered() -> None:
    on_disk = {p.stem for p in HAZARD_DIR.glob("mn*.py")}
    assert on_disk and all(HAZARD_MODULE.match(stem) for stem in on_disk)
    assert {hazard_module_name(rule) for rule in ALL_RULES} == on_disk
    assert ALL_RULES == discover_rules()


def test_helper_modules_define_no_hazard() -> None:
    helpers = [m for m in package_modules() if not HAZARD_MODULE.match(_short(m.__name__))]
    assert {_short(m.__name__) for m in helpers} >= {"registry"}
    for module in helpers:
        assert rules_defined_in(module) == [], module.__name__


@pytest.mark.parametrize("rule", ALL_RULES, ids=[r.code for r in ALL_RULES])
def test_every_code_has_its_fixture(rule: type[Rule]) -> None:
    assert (ROOT / "fixtures" / "lint" / f"{rule.code}.py").is_file()


@pytest.mark.parametrize("rule", ALL_RULES, ids=[r.code for r in ALL_RULES])
def test_hazard_module_names_the_step_that_fixes_it(rule: type[Rule]) -> None:
    """A fixable hazard's module points at its fix: the step's name and the module that registers
    the step (possibly itself); an unfixable one names none."""
    doc = sys.modules[rule.__module__].__doc__ or ""
    fixing = [step for step in load_rewrites() if rule.code in step.fixes]
    assert bool(fixing) == rule.fixable
    for step in fixing:
        assert f"``{step.step}``" in " ".join(doc.split()), (rule, step.step)
        if step.plan.__module__ != rule.__module__:  # else the fix is in the module itself
            where = step.plan.__module__.replace(".", "/") + ".py"
            assert where in doc.replace("\n", " "), (rule, where)


def test_a_hazard_that_owns_its_fix_is_found_by_the_rewrite_registry() -> None:
    """The optimizer step lives in the MN503 module, and convert still plans it."""
    step = next(s for s in load_rewrites() if s.step == "optimizer")
    assert step.plan.__module__ == "mnify.hazards.mn503_optimizer_not_multi_node"
    assert step.fixes == ("MN503",)
