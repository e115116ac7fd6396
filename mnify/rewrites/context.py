"""Per-file state shared by the rewrites: facts, the edit plan, the report, and comm access.

``comm_at`` answers the question every rewrite asks before emitting ``comm``: can code at this
spot see the communicator? Inside the training entry point it can. In a module-level helper
function or a model class's ``__init__`` it cannot, so the helper/class gains a keyword-only
``comm`` parameter and its call sites pass ``comm=comm`` (threading, finished by
:meth:`FileContext.thread_calls` once every file of a conversion has been planned).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from mnify.lint.noqa import Suppressions, parse_suppressions
from mnify.rewrites.edits import EditPlan, expression
from mnify.rewrites.facts import CallFact, Facts
from mnify.rewrites.lines import line_table
from mnify.rewrites.options import ConvertOptions, Spelling
from mnify.rewrites.registry import step_code, step_codes
from mnify.rewrites.report import ReportEntry, Severity


@dataclass(eq=False)
class Entry:
    """Where the training entry point is and what the communicator is called there."""

    func: cst.FunctionDef | None  # None: module level
    comm: str = "comm"
    exists: bool = False  # the file already creates a communicator (converted before)
    creation: cst.BaseStatement | None = None  # ... in this statement
    anchor: cst.BaseStatement | None = None  # comm goes right after this statement
    top_of: cst.FunctionDef | None = None  # ... or at the top of this function's body
    args: str | None = None  # the argparse namespace variable
    device_dest: str | None = None
    device_style: str | None = None  # int | str | flag


@dataclass(eq=False)
class FileContext:
    path: str
    module_name: str
    source: str
    wrapper: MetadataWrapper
    module: cst.Module
    facts: Facts
    options: ConvertOptions
    plan: EditPlan = field(default_factory=EditPlan)
    entries: list[ReportEntry] = field(default_factory=list)
    found: list[ReportEntry] = field(default_factory=list)  # lint's findings in the input
    entry: Entry | None = None
    comm_needed: bool = False
    needs_comm_funcs: dict[str, cst.FunctionDef] = field(default_factory=dict)
    needs_comm_classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    imports_needed: set[str] = field(default_factory=set)
    # functions of the project that reach a collective once converted ("helpers.load_data"):
    # a call of one is never put under a rank guard
    collective_callees: frozenset[str] = frozenset()
    # whether a class imported from a sibling module that is not converted uses BatchNorm
    external_bn: Callable[[str], bool] = field(default=lambda qname: False)
    # statements to insert before the communicator (the forkserver preamble)
    preamble: list[cst.BaseStatement] = field(default_factory=list)
    _positions: object | None = None
    _suppressions: Suppressions | None = None
    _lines: dict[int, int] | None = None
    _quote: str | None = None
    _threaded_sites: set[int] = field(default_factory=set)

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

    @property
    def runtime(self) -> Spelling:
        """The spelling of runtime names, noting that the file now needs the runtime import."""
        self.use_runtime()
        return self.spell

    def use_runtime(self) -> None:
        self.imports_needed.add(self.spell.import_line)

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

    def suppressed(self, node: cst.CSTNode, step: str, code: str | None = None) -> bool:
        """Whether a ``# noqa`` comment keeps ``step`` (or just its rule ``code``) off the
        node's first line, or a ``# mnify: noqa: CODE`` off the whole file: read exactly as
        ``mnify lint`` reads it, with the step's rule codes and its own MN8xx code."""
        if self._suppressions is None:
            self._suppressions = parse_suppressions(self.source)
        if not self._suppressions.line_codes and not self._suppressions.file_codes:
            return False
        lineno = self.line(node)
        codes = {code} if code is not None else set(step_codes(step))
        if code is not None:
            codes |= {c for c in step_codes(step) if c.startswith("MN8")}
        return any(self._suppressions.suppresses(lineno, c) for c in codes)

    def note(
        self,
        node: cst.CSTNode | None,
        step: str,
        severity: Severity,
        message: str,
        code: str | None = None,
    ) -> None:
        """A report entry, filed under ``code`` or else the step's rule code."""
        line = self.line(node) if node is not None else 1
        self.entries.append(
            ReportEntry(self.path, line, step, severity, message, code or step_code(step))
        )

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

    def visible(self, func: cst.FunctionDef | None) -> bool:
        """Whether code in ``func`` sees the entry point's communicator without threading."""
        entry = self.entry
        return entry is not None and (
            entry.func is None or (func is not None and self._inside(func, entry.func))
        )

    def comm_at(self, func: cst.FunctionDef | None, why: str) -> str | None:
        """The expression naming the communicator at code inside ``func`` (None: module level).

        Returns None when the communicator cannot reach that spot; threading a ``comm``
        parameter into a module-level function or a top-level class's ``__init__`` is arranged
        here. ``why`` names the construct, for the report.
        """
        entry = self.entry
        if entry is not None and (
            entry.func is None or (func is not None and self._inside(func, entry.func))
        ):
            self.comm_needed = True
            return entry.comm
        if func is None:
            return None
        outer = self._outermost(func)
        if isinstance(outer, cst.ClassDef):
            method = func
            while self.facts.func_parent.get(id(method)) is not outer:
                parent = self.facts.func_parent.get(id(method))
                assert isinstance(parent, cst.FunctionDef)
                method = parent
            if method.name.value != "__init__" or outer.name.value not in self.facts.classes:
                return None
            self._add_comm_param(method)
            self.needs_comm_classes[outer.name.value] = outer
            return "comm"
        self._add_comm_param(outer)
        self.needs_comm_funcs[outer.name.value] = outer
        return "comm"

    def _add_comm_param(self, func: cst.FunctionDef) -> None:
        params = func.params
        existing = [p.name.value for p in (*params.params, *params.kwonly_params)]
        if "comm" in existing or id(func) in self._threaded_sites:
            return
        self._threaded_sites.add(id(func))
        owner = self.facts.func_class.get(id(func))
        label = f"{owner.name.value}.__init__" if owner is not None else func.name.value
        self.note(func, "threading", "changed", f"{label} takes a keyword-only comm parameter")

        def add(node: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(node, cst.FunctionDef)
            p = node.params
            star = p.star_arg
            if isinstance(star, cst.MaybeSentinel):
                star = cst.ParamStar()
            return node.with_changes(
                params=p.with_changes(
                    star_arg=star, kwonly_params=[*p.kwonly_params, cst.Param(cst.Name("comm"))]
                )
            )

        self.plan.replace_node(func, add, func)

    def thread_calls(self, callees: dict[str, str]) -> bool:
        """Pass ``comm=`` at every call of a function/class that now takes ``comm``.

        ``callees`` maps a qualified name as seen from this file to a readable label. Returns
        whether this added new callees of its own (the project repeats until stable).
        """
        before = len(self.needs_comm_funcs) + len(self.needs_comm_classes)
        for call in self.facts.calls:
            label = self._callee_label(call, callees)
            if label is None or id(call.node) in self._threaded_sites:
                continue
            if any(
                a.keyword is not None and a.keyword.value == "comm" for a in call.node.args
            ) or any(
                isinstance(a.value, cst.Name) and a.value.value == "comm" for a in call.node.args
            ):
                continue
            if call.method == "__init__" or (call.qname.endswith("super")):
                continue
            self._threaded_sites.add(id(call.node))
            if self.suppressed(call.node, "threading"):
                continue
            comm = self.comm_at(call.func, label)
            if comm is None:
                self.note(
                    call.node,
                    "threading",
                    "needs-person",
                    f"{label} now takes comm=..., but this call cannot see the communicator: "
                    "pass it by hand",
                )
                continue
            self.plan.replace_node(call.node, _add_keyword("comm", comm), call.stmt)
            self.note(call.node, "threading", "changed", f"pass comm to {label}")
        return len(self.needs_comm_funcs) + len(self.needs_comm_classes) > before

    def thread_subclasses(self, callees: dict[str, str]) -> bool:
        """Subclasses of a model class that now takes ``comm`` take it too and pass it on.

        ``Sub.__init__`` gains the keyword-only parameter and its ``super().__init__(...)``
        (or ``Base.__init__(self, ...)``) passes ``comm=comm``; a subclass without its own
        ``__init__`` simply inherits the new signature. Returns whether anything was added.
        """
        grew = False
        for name, bases in self.facts.class_bases.items():
            if name in self.needs_comm_classes:
                continue
            base = next((b for b in bases if self._matches(b, callees)), None)
            if base is None:
                continue
            cls = self.facts.classes[name]
            self.needs_comm_classes[name] = cls
            grew = True
            init = next(
                (
                    s
                    for s in cls.body.body
                    if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
                ),
                None,
            )
            if init is None:
                continue
            self._add_comm_param(init)
            for call in self.facts.calls:
                if call.func is init and call.method == "__init__":
                    self._threaded_sites.add(id(call.node))
                    self.plan.replace_node(call.node, _add_keyword("comm", "comm"), call.stmt)
                    self.note(call.node, "threading", "changed", f"{name} passes comm to {base}")
        return grew

    def _matches(self, qname: str, callees: dict[str, str]) -> bool:
        q = qname.lstrip(".")
        return q in callees or any(q.endswith("." + n) for n in callees)

    def _callee_label(self, call: CallFact, callees: dict[str, str]) -> str | None:
        if not call.qname:
            return None
        q = call.qname.lstrip(".")
        if q in callees:
            return callees[q]
        for name, label in callees.items():
            if q.endswith("." + name):
                return label
        return None


def _add_keyword(name: str, value: str) -> Callable[[cst.CSTNode], cst.CSTNode]:
    """A replace-fn appending ``name=value`` to a call's arguments."""

    def add(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        args = list(node.args)
        if args:
            last = args[-1]
            if isinstance(last.comma, cst.MaybeSentinel):
                args[-1] = last.with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
        args.append(
            cst.Arg(
                value=expression(value),
                keyword=cst.Name(name),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(""),
                ),
            )
        )
        return node.with_changes(args=args)

    return add
