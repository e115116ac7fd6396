"""Files opened into a variable (``log = open(path, 'w')``) and what writes through them
(``writer = csv.writer(log)``, ``writer.writerow(row)``, ``log.close()``).

Such a family is rank 0's as a whole or not at all: its bindings run on rank 0 (the other ranks
bind ``None``) and every statement using it is guarded. When one use is not a plain statement of
its own (the handle is passed into code that also trains, read in a loop header, returned), the
family is left alone and the output lint reports the write.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from mnify.program.facts import Facts
from mnify.syntax import names_in


@dataclass(eq=False)
class HandleFamily:
    """The names of one function's write handles, their binding statements and the statements
    that use them."""

    names: set[str] = field(default_factory=set)
    bindings: list[cst.SimpleStatementLine] = field(default_factory=list)
    uses: list[cst.SimpleStatementLine] = field(default_factory=list)


def _single_assign(stmt: cst.BaseStatement | None) -> tuple[str, cst.Call] | None:
    """``name = call(...)`` alone on its line."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    target = small.targets[0].target
    if not isinstance(target, cst.Name) or not isinstance(small.value, cst.Call):
        return None
    return target.value, small.value


def _passes(call: cst.Call, names: set[str]) -> bool:
    return any(isinstance(a.value, cst.Name) and a.value.value in names for a in call.args)


def _writes_through(small: cst.BaseSmallStatement, names: set[str]) -> bool:
    """``h.method(...)``, ``f(..., h, ...)`` or ``print(..., file=h)`` as a whole statement."""
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return False
    call = small.value
    func = call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        if func.value.value in names:
            return True
    return _passes(call, names)


def _statements(body: cst.BaseSuite) -> list[cst.BaseStatement]:
    """Every statement under ``body``, nested blocks included (not nested functions)."""
    out: list[cst.BaseStatement] = []
    if not isinstance(body, cst.IndentedBlock):
        return out
    for stmt in body.body:
        out.append(stmt)
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        for suite in _suites(stmt):
            out.extend(_statements(suite))
    return out


def _suites(stmt: cst.BaseStatement) -> list[cst.BaseSuite]:
    suites: list[cst.BaseSuite] = []
    body = getattr(stmt, "body", None)
    if isinstance(body, cst.BaseSuite):
        suites.append(body)
    for name in ("orelse", "finalbody"):
        part = getattr(stmt, name, None)
        while part is not None:
            inner = getattr(part, "body", None)
            if isinstance(inner, cst.BaseSuite):
                suites.append(inner)
            part = getattr(part, "orelse", None) if isinstance(part, cst.If) else None
    for handler in getattr(stmt, "handlers", ()) or ():
        suites.append(handler.body)
    return suites


def _header(stmt: cst.BaseStatement) -> list[cst.CSTNode]:
    """The parts of a compound statement outside its blocks (test, iterable, items)."""
    parts: list[cst.CSTNode] = []
    for name in ("test", "iter", "target", "items"):
        value = getattr(stmt, name, None)
        if isinstance(value, cst.CSTNode):
            parts.append(value)
        elif isinstance(value, (list, tuple)):
            parts.extend(v for v in value if isinstance(v, cst.CSTNode))
    return parts


def families(facts: Facts, module: cst.Module, opens_for_writing: set[int]) -> list[HandleFamily]:
    """One family per function (or module) that opens a file for writing into a variable.

    ``opens_for_writing``: ids of the ``open(path, 'w'...)`` calls of the file."""
    by_scope: dict[int, tuple[cst.CSTNode, HandleFamily]] = {}
    for a in facts.assigns:
        bound = _single_assign(a.stmt)
        if bound is None or id(bound[1]) not in opens_for_writing:
            continue
        scope: cst.CSTNode = a.func if a.func is not None else module
        _, family = by_scope.setdefault(id(scope), (scope, HandleFamily()))
        family.names.add(bound[0])
    found: list[HandleFamily] = []
    for scope, family in by_scope.values():
        body = scope.body if isinstance(scope, cst.FunctionDef) else None
        stmts = (
            _statements(body)
            if body is not None
            else _statements(cst.IndentedBlock(body=list(module.body)))
        )
        # Objects made from a handle write through it too (csv.writer(f), DictWriter(f, ...)).
        grown = True
        while grown:
            grown = False
            for stmt in stmts:
                bound = _single_assign(stmt)
                if bound is not None and bound[0] not in family.names:
                    if _passes(bound[1], family.names):
                        family.names.add(bound[0])
                        grown = True
        ok = True
        for stmt in stmts:
            if isinstance(stmt, cst.SimpleStatementLine):
                if not names_in([stmt]) & family.names:
                    continue
                bound = _single_assign(stmt)
                if bound is not None and bound[0] in family.names:
                    opened = id(bound[1]) in opens_for_writing
                    if opened or _passes(bound[1], family.names):
                        family.bindings.append(stmt)
                        continue
                if all(_writes_through(s, family.names) for s in stmt.body):
                    family.uses.append(stmt)
                    continue
                ok = False
            elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                if names_in([stmt]) & family.names:
                    ok = False  # a nested function closes over the handle
            elif names_in(_header(stmt)) & family.names:
                ok = False
        if ok and family.bindings:
            found.append(family)
    return found
