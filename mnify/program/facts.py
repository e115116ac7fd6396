"""The table of one file that every rewrite plans from, recorded during the program's one walk.

Name resolution (libcst's ``QualifiedNameProvider``) is by far the most expensive part of a
conversion, so it runs once per file inside one ``MetadataWrapper``, and ``FactCollector``
records, in the walk ``mnify.program.walk`` makes, calls (with their qualified names),
assignments, functions, classes, imports, which block each statement sits in, attribute
reads, divisions and iteration units. The rewrites then plan their edits from these facts
without walking the tree again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import QualifiedNameProvider

from mnify import vocabulary as vocab
from mnify.syntax import is_rank0_test, mentions_rank, target_names

Scope = cst.FunctionDef | cst.ClassDef | None


@dataclass(eq=False)
class CallFact:
    """A call, what it resolves to, and where it sits."""

    node: cst.Call
    qname: str
    func: cst.FunctionDef | None
    cls: cst.ClassDef | None
    stmt: cst.BaseStatement | None
    parent_call: cst.Call | None
    parent_qname: str
    method: str | None
    receiver: str | None


@dataclass(eq=False)
class AssignFact:
    """``a, b = value`` (also annotated and augmented assignments), by target names."""

    stmt: cst.BaseStatement | None
    targets: tuple[str, ...]
    value: cst.BaseExpression | None
    func: cst.FunctionDef | None
    node: cst.CSTNode


@dataclass(eq=False)
class DivisionFact:
    """``left / right`` or ``left /= right`` in a simple statement (a compound statement's
    header is no loss), and the function it runs in."""

    stmt: cst.SimpleStatementLine
    left: cst.BaseExpression
    right: cst.BaseExpression
    func: cst.FunctionDef | None


@dataclass(eq=False)
class IterationUnitFact:
    """Where the file counts in iterations: ``'iteration'`` given to ``call``, or an
    ``(N, 'iteration')`` tuple (``call``: the innermost call around it, None for an assigned
    interval); ``node`` is the call or the tuple."""

    stmt: cst.BaseStatement
    call: cst.Call | None
    node: cst.CSTNode


@dataclass(eq=False)
class Block:
    """A statement list: a module body or an indented block, and the function it runs in."""

    owner: cst.CSTNode
    body: Sequence[cst.BaseStatement]
    func: cst.FunctionDef | None


@dataclass(eq=False)
class Facts:
    """Everything the rewrites read about one file."""

    calls: list[CallFact] = field(default_factory=list)
    assigns: list[AssignFact] = field(default_factory=list)
    module_functions: dict[str, cst.FunctionDef] = field(default_factory=dict)
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    class_bases: dict[str, list[str]] = field(default_factory=dict)
    decorators: dict[int, list[str]] = field(default_factory=dict)  # function -> qualified names
    func_parent: dict[int, Scope] = field(default_factory=dict)
    func_class: dict[int, cst.ClassDef | None] = field(default_factory=dict)
    block_of: dict[int, Block] = field(default_factory=dict)
    imports: list[cst.SimpleStatementLine] = field(default_factory=list)
    imported_modules: dict[str, str] = field(default_factory=dict)  # local name -> module
    has_main_guard: bool = False
    block_owner_stmt: dict[int, cst.BaseStatement] = field(default_factory=dict)
    under_rank0: set[int] = field(default_factory=set)  # statements already under rank == 0
    # statements under any rank check (`comm.rank == 0`, `comm.intra_rank != 1`, ...)
    under_rank_test: set[int] = field(default_factory=set)
    calls_by_stmt: dict[int, list[CallFact]] = field(default_factory=dict)
    call_index: dict[int, CallFact] = field(default_factory=dict)
    assigns_by_name: dict[str, list[AssignFact]] = field(default_factory=dict)
    stmt_parent: dict[int, cst.BaseStatement | None] = field(default_factory=dict)
    # statements (small ones for simple lines) and calls in visiting order, for line numbers
    stmt_order: list[cst.CSTNode] = field(default_factory=list)
    attributes: list[cst.Attribute] = field(default_factory=list)  # every ``a.b``, imports too
    divisions: list[DivisionFact] = field(default_factory=list)
    iteration_units: list[IterationUnitFact] = field(default_factory=list)

    def parent_statement(self, stmt: cst.BaseStatement) -> cst.BaseStatement | None:
        return self.stmt_parent.get(id(stmt))

    def within(self, stmt: cst.BaseStatement, outer: cst.BaseStatement) -> bool:
        """``stmt`` is ``outer`` or a statement of its body, at any depth."""
        current: cst.BaseStatement | None = stmt
        while current is not None:
            if current is outer:
                return True
            current = self.parent_statement(current)
        return False

    def call_of(self, node: cst.CSTNode | None) -> CallFact | None:
        """The fact recorded for a call node (None for anything else)."""
        return self.call_index.get(id(node)) if node is not None else None

    def assigns_of(self, name: str) -> list[AssignFact]:
        if not self.assigns_by_name and self.assigns:
            for a in self.assigns:
                for t in a.targets:
                    self.assigns_by_name.setdefault(t, []).append(a)
        return self.assigns_by_name.get(name, [])

    def local_name_of(self, module: str) -> str | None:
        """The name a plain ``import module [as x]`` binds at module level, if any."""
        for local, mod in self.imported_modules.items():
            if mod == module:
                return local
        return None


def _pick(qnames: Iterable[object]) -> str:
    names = sorted(q.name for q in qnames)  # type: ignore[attr-defined]
    for n in names:
        if n.startswith(vocab.KNOWN_ROOTS):
            return n
    return names[0] if names else ""


# Nodes whose subtrees hold nothing the facts need (tokens, whitespace, literals, names,
# imports: visit_Module reads those itself). Not descending into them makes the walk cheaper.
PRUNED_BY_FACTS: frozenset[type[cst.CSTNode]] = frozenset(
    {
        cst.Name,
        cst.SimpleString,
        cst.Integer,
        cst.Float,
        cst.Imaginary,
        cst.Import,
        cst.ImportFrom,
        cst.Comma,
        cst.Dot,
        cst.Colon,
        cst.Semicolon,
        cst.AssignEqual,
        cst.LeftParen,
        cst.RightParen,
        cst.LeftSquareBracket,
        cst.RightSquareBracket,
        cst.LeftCurlyBrace,
        cst.RightCurlyBrace,
        cst.SimpleWhitespace,
        cst.ParenthesizedWhitespace,
        cst.TrailingWhitespace,
        cst.EmptyLine,
        cst.Newline,
        cst.Comment,
    }
)


class FactCollector(cst.CSTVisitor):
    """The single analysis walk (see module docstring)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.facts = Facts()
        self._scopes: list[cst.FunctionDef | cst.ClassDef] = []
        self._stmts: list[cst.BaseStatement] = []
        self._calls: list[cst.Call] = []  # the calls around the current node
        self._arg_of: dict[int, tuple[cst.Call, str]] = {}
        self._rank0 = 0
        self._rank_test = 0

    # No visit_<Node>_<attribute> hooks here: skipping that dispatch per attribute makes the
    # walk noticeably cheaper.
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None

    # scopes -----------------------------------------------------------------------------
    def _func(self) -> cst.FunctionDef | None:
        for s in reversed(self._scopes):
            if isinstance(s, cst.FunctionDef):
                return s
        return None

    def _record_block(self, owner: cst.CSTNode, body: Sequence[cst.BaseStatement]) -> None:
        block = Block(owner, body, self._func())
        for stmt in body:
            self.facts.block_of[id(stmt)] = block

    def visit_Module(self, node: cst.Module) -> None:
        self._record_block(node, node.body)
        for stmt in node.body:
            if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
            ):
                self.facts.imports.append(stmt)
                for small in stmt.body:
                    if isinstance(small, cst.Import):
                        for alias in small.names:
                            module = cst.helpers.get_full_name_for_node(alias.name) or ""
                            if alias.asname is not None:
                                local = cst.helpers.get_full_name_for_node(alias.asname.name)
                            else:
                                local = module.split(".")[0]
                                module = local
                            if local:
                                self.facts.imported_modules[local] = module
                    elif isinstance(small, cst.ImportFrom) and small.module is not None:
                        base = cst.helpers.get_full_name_for_node(small.module) or ""
                        if isinstance(small.names, Sequence):
                            for alias in small.names:
                                name = cst.helpers.get_full_name_for_node(alias.name) or ""
                                local = (
                                    cst.helpers.get_full_name_for_node(alias.asname.name)
                                    if alias.asname is not None
                                    else name
                                )
                                if local:
                                    self.facts.imported_modules[local] = f"{base}.{name}"
            elif isinstance(stmt, cst.If):
                code = cst.Module([]).code_for_node(stmt.test).replace("'", '"')
                if "__name__" in code and '"__main__"' in code:
                    self.facts.has_main_guard = True

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._record_block(node, node.body)
        if self._stmts:
            self.facts.block_owner_stmt[id(node)] = self._stmts[-1]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        parent = self._scopes[-1] if self._scopes else None
        self.facts.func_parent[id(node)] = parent
        self.facts.func_class[id(node)] = parent if isinstance(parent, cst.ClassDef) else None
        if parent is None:
            self.facts.module_functions[node.name.value] = node
        decorators = []
        for decorator in node.decorators:
            expr = decorator.decorator
            if isinstance(expr, cst.Call):
                expr = expr.func
            decorators.append(_pick(self.get_metadata(QualifiedNameProvider, expr, set())))
        if decorators:
            self.facts.decorators[id(node)] = decorators
        self._scopes.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scopes.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not self._scopes:
            self.facts.classes[node.name.value] = node
            bases: list[str] = []
            for arg in node.bases:
                bases.append(_pick(self.get_metadata(QualifiedNameProvider, arg.value, set())))
            self.facts.class_bases[node.name.value] = bases
        self._scopes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._scopes.pop()

    # statements ---------------------------------------------------------------------------
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.facts.stmt_parent[id(node)] = self._stmts[-1] if self._stmts else None
        self.facts.stmt_order.extend(node.body)
        self._stmts.append(node)

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self.facts.stmt_order.extend(node.body)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._stmts.pop()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if type(node) in PRUNED_BY_FACTS:
            if isinstance(node, (cst.Import, cst.ImportFrom)):
                self.facts.attributes.extend(_dotted_attributes(node))
            return False
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            if self._rank0:
                self.facts.under_rank0.add(id(node))
            if self._rank_test:
                self.facts.under_rank_test.add(id(node))
        if isinstance(node, cst.BaseCompoundStatement):
            self.facts.stmt_parent[id(node)] = self._stmts[-1] if self._stmts else None
            self.facts.stmt_order.append(node)
            self._stmts.append(node)
            if isinstance(node, cst.If) and is_rank0_test(node.test):
                self._rank0 += 1
            if isinstance(node, cst.If) and mentions_rank(node.test):
                self._rank_test += 1
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        if isinstance(original_node, cst.BaseCompoundStatement):
            self._stmts.pop()
            if isinstance(original_node, cst.If) and is_rank0_test(original_node.test):
                self._rank0 -= 1
            if isinstance(original_node, cst.If) and mentions_rank(original_node.test):
                self._rank_test -= 1

    def _stmt(self) -> cst.BaseStatement | None:
        return self._stmts[-1] if self._stmts else None

    # assignments --------------------------------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        names: list[str] = []
        for t in node.targets:
            names.extend(target_names(t.target))
        self.facts.assigns.append(
            AssignFact(self._stmt(), tuple(names), node.value, self._func(), node)
        )

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.facts.assigns.append(
            AssignFact(
                self._stmt(), tuple(target_names(node.target)), node.value, self._func(), node
            )
        )

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.facts.assigns.append(
            AssignFact(
                self._stmt(), tuple(target_names(node.target)), node.value, self._func(), node
            )
        )
        if isinstance(node.operator, cst.DivideAssign):
            self._division(node.target, node.value)

    def visit_For(self, node: cst.For) -> None:
        self.facts.assigns.append(
            AssignFact(node, tuple(target_names(node.target)), None, self._func(), node)
        )

    # attribute reads, divisions, iteration units ------------------------------------------
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.facts.attributes.append(node)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, cst.Divide):
            self._division(node.left, node.right)

    def _division(self, left: cst.BaseExpression, right: cst.BaseExpression) -> None:
        stmt = self._stmt()
        if isinstance(stmt, cst.SimpleStatementLine):
            self.facts.divisions.append(DivisionFact(stmt, left, right, self._func()))

    def visit_Tuple(self, node: cst.Tuple) -> None:
        stmt = self._stmt()
        elements = node.elements
        if stmt is not None and len(elements) == 2 and _is_iteration(elements[1].value):
            call = self._calls[-1] if self._calls else None
            self.facts.iteration_units.append(IterationUnitFact(stmt, call, node))

    # calls --------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        stmt = self._stmt()
        if stmt is not None and any(_is_iteration(a.value) for a in node.args):
            self.facts.iteration_units.append(IterationUnitFact(stmt, node, node))
        self._calls.append(node)
        qname = _pick(self.get_metadata(QualifiedNameProvider, node.func, set()))
        parent = self._arg_of.get(id(node))
        method = receiver = None
        if isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            if isinstance(node.func.value, cst.Name):
                receiver = node.func.value.value
        func = self._func()
        cls = self.facts.func_class.get(id(func)) if func is not None else None
        fact = CallFact(
            node,
            qname,
            func,
            cls,
            self._stmt(),
            parent[0] if parent else None,
            parent[1] if parent else "",
            method,
            receiver,
        )
        self.facts.calls.append(fact)
        self.facts.call_index[id(node)] = fact
        if fact.stmt is not None:
            self.facts.calls_by_stmt.setdefault(id(fact.stmt), []).append(fact)
        for arg in node.args:
            if isinstance(arg.value, cst.Call):
                self._arg_of[id(arg.value)] = (node, qname)

    def leave_Call(self, original_node: cst.Call) -> None:
        self._calls.pop()


def _is_iteration(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.SimpleString) and node.evaluated_value == "iteration"


def _dotted_attributes(node: cst.Import | cst.ImportFrom) -> list[cst.Attribute]:
    """The ``a.b`` nodes of an import's dotted names (the walk does not go into imports)."""
    if isinstance(node, cst.Import):
        names: list[cst.BaseExpression] = [alias.name for alias in node.names]
    else:
        names = [node.module] if node.module is not None else []
        if isinstance(node.names, Sequence):
            names.extend(alias.name for alias in node.names)
    found: list[cst.Attribute] = []
    for name in names:
        while isinstance(name, cst.Attribute):
            found.append(name)
            name = name.value
    return found
