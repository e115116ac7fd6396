"""Syntax helpers shared by the linter and the rewrites: what an expression spells, where an
argument is, which names a statement binds or reads. Plain libcst, no meaning attached."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst


def dotted_name(expr: cst.BaseExpression) -> str | None:
    """``self.comm`` -> "self.comm"; anything that is not a Name/Attribute chain -> None."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = dotted_name(expr.value)
        return None if base is None else f"{base}.{expr.attr.value}"
    return None


_LEAVES = (cst.Name, cst.BaseNumber, cst.SimpleString, cst.Ellipsis)


def subexpressions(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The direct sub-expressions of an expression, in source order: a fast path for the
    common node types (``CSTNode.children`` re-visits the node to collect them, with
    whitespace and punctuation), falling back to ``children`` for the rest."""
    if isinstance(node, _LEAVES):
        return []
    if isinstance(node, cst.Attribute):
        return [node.value]
    if isinstance(node, cst.Call):
        return [node.func, *(arg.value for arg in node.args)]
    if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
        return [node.left, node.right]
    if isinstance(node, cst.Comparison):
        return [node.left, *(target.comparator for target in node.comparisons)]
    if isinstance(node, cst.UnaryOperation):
        return [node.expression]
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return [element.value for element in node.elements]
    if isinstance(node, cst.IfExp):
        return [node.test, node.body, node.orelse]
    if isinstance(node, cst.Subscript):
        found: list[cst.CSTNode] = [node.value]
        for element in node.slice:
            if isinstance(element.slice, cst.Index):
                found.append(element.slice.value)
        return found
    return list(node.children)


def string_value(expr: cst.BaseExpression | None) -> str | None:
    """The value of a plain string literal, else None."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def argument(call: cst.Call, position: int, *keywords: str) -> cst.BaseExpression | None:
    """The expression passed as positional ``position`` or as one of ``keywords``."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in keywords:
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if 0 <= position < len(positional):
        return positional[position].value
    return None


def argument_node(call: cst.Call, position: int, *keywords: str) -> cst.Arg | None:
    """The ``Arg`` passed as positional ``position`` or as one of ``keywords``."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in keywords:
            return arg
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if 0 <= position < len(positional):
        return positional[position]
    return None


def target_names(target: cst.BaseExpression) -> list[str]:
    """Names bound by an assignment target (tuples and lists unpacked; attributes ignored)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: list[str] = []
        for el in target.elements:
            out.extend(target_names(el.value))
        return out
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


def mentions_rank(test: cst.CSTNode) -> bool:
    """An expression that reads a rank (``comm.rank``, ``comm.intra_rank``, ``comm.inter_rank``)."""
    found = False

    class _Finder(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            nonlocal found
            if node.attr.value in ("rank", "intra_rank", "inter_rank"):
                found = True

    test.visit(_Finder())
    return found


def is_rank0_test(test: cst.BaseExpression) -> bool:
    """``comm.rank == 0`` (any communicator name, either operand order)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal):
        return False
    sides = [test.left, target.comparator]
    has_rank = any(isinstance(s, cst.Attribute) and s.attr.value == "rank" for s in sides)
    has_zero = any(isinstance(s, cst.Integer) and s.value == "0" for s in sides)
    return has_rank and has_zero


class _NameCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def names_in(nodes: Iterable[cst.CSTNode]) -> set[str]:
    """Every identifier mentioned in ``nodes`` (a cheap walk, used on a few statements only)."""
    collector = _NameCollector()
    for node in nodes:
        node.visit(collector)
    return collector.names


class _ReadNameCollector(_NameCollector):
    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False


def read_names(node: cst.CSTNode) -> set[str]:
    """Plain names read in ``node``: ``x`` of ``x.shape``, not ``shape`` (an attribute)."""
    collector = _ReadNameCollector()
    node.visit(collector)
    return collector.names


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call inside ``node``, outer before inner, in source order."""
    found: list[cst.Call] = []

    class _Collector(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            found.append(call)

    node.visit(_Collector())
    return found


def assigned_in(nodes: Iterable[cst.CSTNode]) -> set[str]:
    """Names bound by assignments and for-loops inside ``nodes``."""

    class _Collector(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                self.names.update(target_names(t.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            self.names.update(target_names(node.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            self.names.update(target_names(node.target))

        def visit_For(self, node: cst.For) -> None:
            self.names.update(target_names(node.target))

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            self.names.add(node.name.value)
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            self.names.add(node.name.value)
            return False

    collector = _Collector()
    for node in nodes:
        node.visit(collector)
    return collector.names


def log_name_by_rank(log_report: cst.Call) -> bool:
    """A ``LogReport(...)`` whose file name (``filename``, position 3, or the older ``log_name``)
    depends on the rank: it writes on one rank only, so it may stay on every rank."""
    names = (argument(log_report, 3, "filename"), argument(log_report, 99, "log_name"))
    return any(name is not None and mentions_rank(name) for name in names)
