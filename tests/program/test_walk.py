"""The program's one walk (mnify/program/walk.py): attaching hazards to the walk that records the
facts changes neither the facts nor any hazard's findings (nor does leaving the facts out, as
lint does), and a hazard that fails costs the hazards, not the facts the converter plans from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper

from mnify.hazards.rule import Rule
from mnify.lint.registry import ALL_RULES
from mnify.program.context import LintContext
from mnify.program.facts import Facts
from mnify.program.walk import FileProgram, walk_program

ROOT = Path(__file__).resolve().parents[2]
LINT_FIXTURES = sorted((ROOT / "fixtures" / "lint").glob("MN*.py"))
SOURCES = sorted(
    [
        *(ROOT / "fixtures" / "convert").glob("*.in.py"),
        *LINT_FIXTURES,
        *(ROOT / "fixtures" / "corpus" / "scripts").glob("*.py"),
    ]
)


def _wrapper(path: Path) -> MetadataWrapper:
    return MetadataWrapper(cst.parse_module(path.read_text(encoding="utf-8")))


def _facts_summary(facts: Facts) -> dict[str, Any]:
    """Everything the facts hold, by node identity (the same module is walked each time)."""
    return {
        "calls": [
            (c.qname, id(c.node), id(c.stmt), id(c.func), id(c.parent_call), c.parent_qname)
            for c in facts.calls
        ],
        "assigns": [(a.targets, id(a.stmt), id(a.node), id(a.func)) for a in facts.assigns],
        "blocks": sorted((k, id(b.owner), id(b.func)) for k, b in facts.block_of.items()),
        "stmt_order": [id(n) for n in facts.stmt_order],
        "under_rank0": sorted(facts.under_rank0),
        "under_rank_test": sorted(facts.under_rank_test),
        "stmt_parent": sorted((k, id(v)) for k, v in facts.stmt_parent.items()),
        "imports": [id(i) for i in facts.imports],
        "imported_modules": facts.imported_modules,
        "classes": sorted(facts.classes),
        "class_bases": facts.class_bases,
        "decorators": sorted(facts.decorators.items()),
        "attributes": [id(a) for a in facts.attributes],
        "divisions": [(id(d.stmt), id(d.left), id(d.right), id(d.func)) for d in facts.divisions],
        "iteration_units": [(id(u.stmt), id(u.call), id(u.node)) for u in facts.iteration_units],
        "main_guard": facts.has_main_guard,
    }


@pytest.mark.parametrize("path", LINT_FIXTURES, ids=lambda p: p.name)
def test_each_hazard_finds_alone_what_it_finds_beside_the_others(path: Path) -> None:
    """Over the lint fixtures (each makes its rule fire, or shows where it must not): hazards
    sharing the walk do not see each other. One walk a rule per file costs much, so the corpus is left to the test above."""
    wrapper = _wrapper(path)
    together = walk_program(wrapper, path.name, hazards=ALL_RULES, assume="data", facts=False)
    each: dict[str, list[tuple[int, str]]] = {}
    for rule in ALL_RULES:
        alone = walk_program(wrapper, path.name, hazards=[rule], assume="data", facts=False)
        each.update(_findings(alone))
    assert _findings(together) == each


def _findings(program: FileProgram) -> dict[str, list[tuple[int, str]]]:
    found: dict[str, list[tuple[int, str]]] = {}
    for rule in program.hazards:
        if rule.applies():
            rule.finish()
            found[rule.code] = [(id(f.node), f.message) for f in rule.findings]
    return found


def test_the_sources_are_there() -> None:
    assert len(SOURCES) > 60


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_hazards_riding_the_walk_change_neither_facts_nor_findings(path: Path) -> None:
    wrapper = _wrapper(path)
    alone = walk_program(wrapper, path.name)
    together = walk_program(wrapper, path.name, hazards=ALL_RULES, assume="data")
    assert _facts_summary(together.facts) == _facts_summary(alone.facts)
    detecting = walk_program(wrapper, path.name, hazards=ALL_RULES, assume="data", facts=False)
    assert _findings(detecting) == _findings(together)
    with pytest.raises(RuntimeError, match="without its facts"):
        assert detecting.facts is None  # raises before it compares


def test_the_walk_records_divisions_iteration_units_and_attribute_reads() -> None:
    source = (
        "import chainer.training.extensions\n"
        "def loss_of(x, t):\n"
        "    loss = F.sum(x) / t.sum()\n"
        "    loss /= 2\n"
        "    return loss\n"
        "if x / 2:\n"
        "    pass\n"
        "trainer.extend(snap, trigger=(100, 'iteration'))\n"
        "report.log\n"
    )
    program = walk_program(MetadataWrapper(cst.parse_module(source)), "t.py")
    facts = program.facts
    assert [(d.func.name.value if d.func else None) for d in facts.divisions] == [
        "loss_of",
        "loss_of",
    ]  # the `if` header's division is no loss
    (unit,) = facts.iteration_units
    assert isinstance(unit.node, cst.Tuple) and unit.call is not None
    assert cst.Module([]).code_for_node(unit.call.func) == "trainer.extend"
    dotted = {cst.Module([]).code_for_node(a) for a in facts.attributes}
    assert {"chainer.training.extensions", "chainer.training", "report.log"} <= dotted


class _TestHazard(Rule):
    code = "MN999"
    name = "test-hazard"
    summary = why = bad = good = "x"


class _Broken(_TestHazard):
    def visit_Call(self, node: cst.Call) -> None:
        raise RuntimeError("a hazard's bug")


def test_a_failing_hazard_costs_the_hazards_not_the_facts() -> None:
    path = ROOT / "fixtures" / "convert" / "cifar_cnn_bn.in.py"
    wrapper = _wrapper(path)
    alone = walk_program(wrapper, path.name)
    broken = walk_program(wrapper, path.name, hazards=[_Broken, *ALL_RULES])
    assert isinstance(broken.hazard_failure, RuntimeError)
    assert _facts_summary(broken.facts) == _facts_summary(alone.facts)
    assert broken.context.is_training_script


class _NameReader(_TestHazard):
    """A hazard reading names: the walk must go into the subtrees the facts skip for it."""

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self.names: list[str] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.names.append(node.value)


@pytest.mark.parametrize("path", SOURCES[:12], ids=lambda p: p.name)
def test_a_hazard_needing_skipped_subtrees_gets_them_and_the_facts_stay(path: Path) -> None:
    wrapper = _wrapper(path)
    alone = walk_program(wrapper, path.name)
    reading = walk_program(wrapper, path.name, hazards=[_NameReader])
    (reader,) = reading.hazards
    imported = {n.value for n in _import_names(wrapper.module)}
    assert imported and imported <= set(reader.names)
    assert _facts_summary(reading.facts) == _facts_summary(alone.facts)


def _import_names(module: cst.Module) -> list[cst.Name]:
    found: list[cst.Name] = []

    class _Names(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for alias in node.names:
                found.extend(n for n in _names_in(alias.name))

    module.visit(_Names())
    return found


def _names_in(node: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(node, cst.Attribute):
        return [*_names_in(node.value), node.attr]
    return [node] if isinstance(node, cst.Name) else []
