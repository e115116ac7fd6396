"""Shared by MN503 and MN505: constructions of a class and whether a multi-node factory wraps
them (``factory(Cls(...), comm)`` directly or through the name they are assigned to)."""

from __future__ import annotations

import libcst as cst

from mnify.hazards.rule import Rule
from mnify.program.context import LintContext
from mnify.syntax import argument, dotted_name


class WrapTracker(Rule):
    """Shared bookkeeping: constructions of some class and whether a factory wraps them,
    directly (``factory(Cls(...), comm)``) or through the name they are assigned to."""

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self.constructions: list[cst.Call] = []
        self.assigned_to: dict[int, str] = {}
        self.wrapped_ids: set[int] = set()
        self.wrapped_names: set[str] = set()
        self.returned_ids: set[int] = set()
        self.returned_names: set[str] = set()
        self.wrapper_calls = 0

    def is_construction(self, node: cst.Call, names: frozenset[str]) -> bool:
        raise NotImplementedError

    def is_wrapper(self, names: frozenset[str]) -> bool:
        raise NotImplementedError

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call):
            for target in node.targets:
                name = dotted_name(target.target)
                if name is not None:
                    self.assigned_to[id(node.value)] = name

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is None:
            return
        if isinstance(node.value, cst.Call):
            self.returned_ids.add(id(node.value))
        name = dotted_name(node.value)
        if name is not None:
            self.returned_names.add(name)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Call):
            return  # ``Evaluator(...)()`` calls what the inner call built: that one counts
        names = self.ctx.callee_names(node)
        if not names:
            return
        if self.is_wrapper(names):
            self.wrapper_calls += 1
            wrapped = argument(node, 0, "actual_optimizer", "evaluator")
            if isinstance(wrapped, cst.Call):
                self.wrapped_ids.add(id(wrapped))
            elif wrapped is not None:
                name = dotted_name(wrapped)
                if name is not None:
                    self.wrapped_names.add(name)
        elif self.is_construction(node, names):
            self.constructions.append(node)

    def unwrapped(self) -> list[cst.Call]:
        """Constructions never wrapped. A construction returned from a helper counts as wrapped
        when the file wraps something (the caller wraps the helper's result)."""
        result = []
        for call in self.constructions:
            name = self.assigned_to.get(id(call))
            if id(call) in self.wrapped_ids or (name is not None and name in self.wrapped_names):
                continue
            returned = id(call) in self.returned_ids or (
                name is not None and name in self.returned_names
            )
            if returned and self.wrapper_calls:
                continue
            result.append(call)
        return result
