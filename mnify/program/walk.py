"""One walk of a file builds its whole model: the facts table the rewrites plan from, the flow
context the hazards detect with, and every attached hazard's findings (docs/design.md §1).

Before, the converter walked each input twice over one name resolution: once to collect its
facts, once more for lint. Now the three ride the same traversal: on the way down the fact
collector records the node, the flow context moves to it, then the hazards' ``visit_<Node>``
methods see it (context first, so a hazard asks where it is); on the way up in the reverse
order. A hazard is any object with libcst-style ``visit_``/``leave_`` methods, built from the
context (``Rule(ctx)``); this package sits below the hazards and does not import them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from mnify.program.context import LintContext
from mnify.program.effects import ProjectEffects
from mnify.program.facts import PRUNED_BY_FACTS, FactCollector, Facts

_Handler = Callable[[Any], None]
_dispatch_cache: dict[type, tuple[dict[str, list[str]], dict[str, list[str]]]] = {}

# Node types that can stand inside a subtree the fact collector skips (see facts.PRUNED_BY_FACTS):
# a hazard visiting one of these needs the walk to go into those subtrees after all.
_INSIDE_PRUNED = frozenset(
    {t.__name__ for t in PRUNED_BY_FACTS}
    | {"Attribute", "ImportAlias", "AsName", "ImportStar", "Name", "Dot"}
)


@dataclass(eq=False)
class FileProgram:
    """One file's model after its walk: ``facts`` (position-indexed: calls, assignments, blocks,
    rank guards), ``context`` (the flow walk's bindings, functions and the script's kind) and
    the ``hazards`` that rode the walk, holding their findings."""

    path: str
    wrapper: MetadataWrapper
    recorded_facts: Facts | None  # None: walked for detection only (lint)
    context: LintContext
    hazards: list[Any] = field(default_factory=list)
    # a hazard's visitor raised: the walk finished the facts and context without the hazards
    hazard_failure: Exception | None = None

    @property
    def module(self) -> cst.Module:
        return self.wrapper.module

    @property
    def facts(self) -> Facts:
        if self.recorded_facts is None:
            raise RuntimeError(f"{self.path} was walked for detection only, without its facts")
        return self.recorded_facts


def walk_program(
    wrapper: MetadataWrapper,
    path: str,
    *,
    hazards: Sequence[Callable[[LintContext], Any]] = (),
    assume: str | None = None,
    external_collectives: Mapping[str, str] | None = None,
    facts: bool = True,
    effects: ProjectEffects | None = None,
) -> FileProgram:
    """Walk ``wrapper``'s module once (one ``QualifiedNameProvider`` resolution, reused if the
    wrapper already has it) and return its model with ``hazards`` (classes or factories taking
    the context) built and run on the way. ``assume`` and ``external_collectives``: see
    :class:`~mnify.program.context.LintContext`. ``facts=False`` leaves the facts table out
    (lint plans no edit; recording it would cost every lint run about a twentieth).
    ``effects``: the program's effects, whose resolution says what the file's calls build
    (``LintContext.builds_optimizer``); the file's ``path`` must be one of theirs."""
    context = LintContext(path, wrapper.resolve(QualifiedNameProvider))
    context.external_collectives = external_collectives or {}
    context.assume = assume
    context.effects = effects
    attached = [make(context) for make in hazards]
    collector = FactCollector() if facts else None
    walk = _ProgramWalk(collector, context, attached)
    if collector is None:
        wrapper.module.visit(walk)
    else:
        with collector.resolve(wrapper):
            wrapper.module.visit(walk)
    recorded = collector.facts if collector is not None else None
    return FileProgram(path, wrapper, recorded, context, attached, walk.hazard_failure)


def _handler_names(hazard: type) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``{"Call": ["visit_Call"]}``-style tables of a hazard class's visitor methods (cached)."""
    cached = _dispatch_cache.get(hazard)
    if cached is None:
        visits: dict[str, list[str]] = {}
        leaves: dict[str, list[str]] = {}
        for attribute in dir(hazard):
            if attribute.startswith("visit_"):
                visits.setdefault(attribute[6:], []).append(attribute)
            elif attribute.startswith("leave_"):
                leaves.setdefault(attribute[6:], []).append(attribute)
        cached = _dispatch_cache[hazard] = (visits, leaves)
    return cached


class _ProgramWalk(cst.CSTVisitor):
    """The single traversal (see the module docstring)."""

    def __init__(
        self, collector: FactCollector | None, context: LintContext, hazards: Sequence[Any]
    ):
        super().__init__()
        self._collector = collector
        self._context = context
        self._visits: dict[str, list[_Handler]] = {}
        self._leaves: dict[str, list[_Handler]] = {}
        for hazard in hazards:
            visits, leaves = _handler_names(type(hazard))
            for node_type, methods in visits.items():
                self._visits.setdefault(node_type, []).extend(getattr(hazard, m) for m in methods)
            for node_type, methods in leaves.items():
                self._leaves.setdefault(node_type, []).extend(getattr(hazard, m) for m in methods)
        handled = set(self._visits) | set(self._leaves)
        # subtrees nobody needs are skipped, as the fact collector alone would skip them
        self._may_prune = not (handled & _INSIDE_PRUNED)
        self._facts_skip: cst.CSTNode | None = None  # the node whose subtree the facts skip
        self.hazard_failure: Exception | None = None

    def on_visit(self, node: cst.CSTNode) -> bool:
        nothing_inside = type(node) in PRUNED_BY_FACTS
        collector = self._collector
        if collector is not None and self._facts_skip is None:
            collector.on_visit(node)  # it skips exactly the PRUNED_BY_FACTS subtrees
            if nothing_inside:
                self._facts_skip = node
        self._context.enter(node)
        handlers = self._visits.get(type(node).__name__)
        if handlers:
            self._run(handlers, node)
        return not (nothing_inside and self._may_prune)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        handlers = self._leaves.get(type(original_node).__name__)
        if handlers:
            self._run(handlers, original_node)
        self._context.leave(original_node)
        collector = self._collector
        if collector is None:
            return
        if self._facts_skip is None:
            collector.on_leave(original_node)
        elif self._facts_skip is original_node:
            collector.on_leave(original_node)
            self._facts_skip = None

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if type(node) is cst.If and (attribute == "body" or attribute == "orelse"):
            self._context.enter_branch(node, attribute)  # type: ignore[arg-type]

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        if type(original_node) is cst.If and (attribute == "body" or attribute == "orelse"):
            self._context.leave_branch(original_node)  # type: ignore[arg-type]

    def _run(self, handlers: list[_Handler], node: cst.CSTNode) -> None:
        try:
            for handler in handlers:
                handler(node)
        except Exception as exc:  # a hazard's bug must not cost the facts: drop the hazards
            self.hazard_failure = exc
            self._visits.clear()
            self._leaves.clear()
