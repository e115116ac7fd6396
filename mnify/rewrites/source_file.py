"""What a rewrite reads about one file: its text, its program (tree, resolved facts, the
findings of the input's hazards: mnify/program/walk.py) and options, and what the project tells
it, with the questions answered from them (lines, ``# noqa``, code, scopes).

Nothing here is changed by planning: the edit plan and the report live on
``context.FileContext``, which extends this with the state the rewrites write. The driver sets
the project's facts (``project_evaluators``, ``collective_callees``, ``external_bn``) before
any rewrite plans (``project_facts``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from mnify.program.effects import Effects, ProjectEffects
from mnify.program.facts import CallFact, Facts
from mnify.program.noqa import Suppressions, parse_suppressions
from mnify.program.walk import FileProgram
from mnify.rewrites.lines import line_table
from mnify.rewrites.options import ConvertOptions, Spelling
from mnify.rewrites.step_codes import step_codes


@dataclass(eq=False)
class SourceFile:
    """One file of a conversion, read-only to the rewrites (the caches fill on first use)."""

    path: str
    module_name: str
    source: str
    program: FileProgram  # the file's one walk: facts, flow context, the input's findings
    options: ConvertOptions
    # Evaluator subclasses of the other converted files: "module.Class" -> whole-set metric
    project_evaluators: dict[str, bool] = field(default_factory=dict)
    # functions of the project that reach a collective once converted ("helpers.load_data"):
    # a call of one is never put under a rank guard
    collective_callees: frozenset[str] = frozenset()
    # whether a class imported from a sibling module that is not converted uses BatchNorm
    external_bn: Callable[[str], bool] = field(default=lambda qname: False)
    # what the program's functions do, transitively (mnify/program/effects.py); None when the
    # file is planned on its own (lint --fix)
    effects: ProjectEffects | None = None
    _positions: object | None = None
    _suppressions: Suppressions | None = None
    _lines: dict[int, int] | None = None
    _quote: str | None = None

    @property
    def wrapper(self) -> MetadataWrapper:
        return self.program.wrapper

    @property
    def module(self) -> cst.Module:
        return self.program.module

    @property
    def facts(self) -> Facts:
        return self.program.facts

    @property
    def spell(self) -> Spelling:
        return Spelling(self.options.target)

    def q(self, text: str) -> str:
        """``text`` as a string literal in the file's own quote style (single unless the file
        prefers double quotes, as black-formatted files do)."""
        if self._quote is None:
            src = self.source  # docstrings' triple quotes say nothing about the style
            double = src.count('"') - 3 * src.count('"""')
            single = src.count("'") - 3 * src.count("'''")
            self._quote = '"' if double > single else "'"
        return f"{self._quote}{text}{self._quote}"

    # positions, noqa, report ----------------------------------------------------------
    def line(self, node: cst.CSTNode) -> int:
        """1-based line of a call or statement (``lines`` module; PositionProvider if unsure)."""
        if self._lines is None:
            self._lines = (
                line_table(self.source, [c.node for c in self.facts.calls], self.facts.stmt_order)
                or {}
            )
        key = node.body[0] if isinstance(node, cst.SimpleStatementLine) and node.body else node
        found = self._lines.get(id(key))
        if found is not None:
            return found
        if self._positions is None:
            self._positions = self.wrapper.resolve(PositionProvider)
        pos = self._positions.get(node)  # type: ignore[attr-defined]
        return int(pos.start.line) if pos is not None else 0

    def call_effects(self, call: CallFact) -> Effects:
        """What ``call`` does, through whatever it calls (empty without the program's effects)."""
        name = self.called_by(call)
        if self.effects is None or name is None:
            return {}
        line = self.line(call.node)
        return self.effects.at_lines(self.path, line, line, name)

    def builds_optimizer(self, call: CallFact) -> bool:
        """Whether ``call`` builds a Chainer optimizer: what its callee resolves to decides (a
        project's subclass of Chainer's optimizer is one, its own class named ``SGD`` is not),
        asked of the program's walk (``LintContext.builds_optimizer``), as lint asks it."""
        return self.program.context.builds_optimizer(call.node)

    def called_by(self, call: CallFact) -> str | None:
        """The name a call is made by: ``f`` of ``f(...)``, ``save`` of ``obj.save(...)``."""
        func = call.node.func
        if isinstance(func, cst.Attribute):
            return func.attr.value
        return func.value if isinstance(func, cst.Name) else None

    def effects_of_scope(self, func: cst.FunctionDef | None) -> Effects:
        """What the entry function (or the module's own code, for None) does, transitively."""
        if self.effects is None:
            return {}
        if func is None:
            return self.effects.function(self.path, "<module>")
        return self.effects.function(self.path, func.name.value)

    @property
    def suppressions(self) -> Suppressions:
        """The file's ``# noqa`` comments, read once for the rewrites and the input's lint."""
        if self._suppressions is None:
            self._suppressions = parse_suppressions(self.source)
        return self._suppressions

    def suppressed(self, node: cst.CSTNode, step: str, code: str | None = None) -> bool:
        """Whether a ``# noqa`` comment keeps ``step`` (or just its rule ``code``) off the
        node's first line, or a ``# mnify: noqa: CODE`` off the whole file: read exactly as
        ``mnify lint`` reads it, with the step's rule codes and its own MN8xx code."""
        suppressions = self.suppressions
        if not suppressions.line_codes and not suppressions.file_codes:
            return False
        lineno = self.line(node)
        codes = {code} if code is not None else set(step_codes(step))
        if code is not None:
            codes |= {c for c in step_codes(step) if c.startswith("MN8")}
        return any(suppressions.suppresses(lineno, c) for c in codes)

    def reaches_collective(self, stmt: cst.BaseStatement) -> str | None:
        """The project function reaching a collective that a call inside ``stmt`` names."""
        if not self.collective_callees:
            return None
        inside = {id(stmt)}
        for call in self.facts.calls:
            holder = call.stmt
            chain = []
            while holder is not None and id(holder) not in inside:
                chain.append(holder)
                holder = self.facts.parent_statement(holder)
            if holder is None:
                continue
            inside.update(id(h) for h in chain)
            bare = call.qname.lstrip(".")
            for name in self.collective_callees:
                module, _, func = name.rpartition(".")
                local = module == self.module_name and bare == func
                if local or bare == name or bare.endswith("." + name):
                    return name
        return None

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # comm access ----------------------------------------------------------------------
    def _inside(self, func: cst.FunctionDef | None, outer: cst.FunctionDef) -> bool:
        scope: object = func
        while scope is not None:
            if scope is outer:
                return True
            scope = self.facts.func_parent.get(id(scope))
        return False

    def _outermost(self, func: cst.FunctionDef) -> cst.FunctionDef | cst.ClassDef:
        scope: cst.FunctionDef | cst.ClassDef = func
        while True:
            parent = self.facts.func_parent.get(id(scope))
            if parent is None:
                return scope
            scope = parent

    def returns_value_of(self, func: cst.FunctionDef, call: cst.Call) -> bool:
        """Whether the helper ``func`` returns what ``call`` built (``return Adam()``, or
        ``opt = Adam(); ...; return opt``), so wrapping the helper's result wraps that object."""
        bound = {
            name
            for a in self.facts.assigns
            if a.value is call and a.func is func
            for name in a.targets
        }
        found = False

        class _Returns(cst.CSTVisitor):
            def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
                return node is func  # returns of nested functions are theirs

            def visit_ClassDef(self, node: cst.ClassDef) -> bool:
                return False

            def visit_Return(self, node: cst.Return) -> None:
                nonlocal found
                value = node.value
                if value is call or (isinstance(value, cst.Name) and value.value in bound):
                    found = True

        func.visit(_Returns())
        return found

    def outermost_scope(
        self, func: cst.FunctionDef | None
    ) -> cst.FunctionDef | cst.ClassDef | None:
        """The module-level function or class that holds ``func`` (None at module level)."""
        return self._outermost(func) if func is not None else None
