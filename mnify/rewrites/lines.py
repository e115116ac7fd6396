"""Line numbers for the report and ``# noqa`` without libcst's ``PositionProvider``.

``PositionProvider`` re-generates the whole file to learn positions, which costs about as much
as parsing it twice. Only calls and statements ever need a line here, and Python's own ``ast``
knows theirs: sorted by start position (outer before inner on a tie), ast calls and statements
come in the same order libcst visits them. The pairing is checked call by call (same callee
name) and statement by statement (same kind); on any disagreement the caller falls back to
``PositionProvider``.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

import libcst as cst

_SAME_KIND = {"Delete": "Del", "TryStar": "Try"}


def _key(node: ast.AST) -> tuple[int, int, int, int]:
    return (
        getattr(node, "lineno", 0),
        getattr(node, "col_offset", 0),
        -(getattr(node, "end_lineno", 0) or 0),
        -(getattr(node, "end_col_offset", 0) or 0),
    )


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _cst_callee(func: cst.BaseExpression) -> str | None:
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _kind(node: ast.AST) -> str:
    name = type(node).__name__.removeprefix("Async")
    return _SAME_KIND.get(name, name)


def line_table(
    source: str, calls: Sequence[cst.Call], statements: Sequence[cst.CSTNode]
) -> dict[int, int] | None:
    """``{id(libcst node): line}`` for the given calls and statements, or None if unsure."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    ast_calls: list[ast.Call] = []
    ast_stmts: list[ast.stmt] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            ast_calls.append(node)
        elif isinstance(node, ast.stmt):
            ast_stmts.append(node)
    if len(ast_calls) != len(calls) or len(ast_stmts) != len(statements):
        return None
    ast_calls.sort(key=_key)
    ast_stmts.sort(key=_key)
    table: dict[int, int] = {}
    for mine, theirs in zip(calls, ast_calls, strict=True):
        if _cst_callee(mine.func) != _callee(theirs.func):
            return None
        table[id(mine)] = theirs.lineno
    for mine_stmt, their_stmt in zip(statements, ast_stmts, strict=True):
        if type(mine_stmt).__name__ != _kind(their_stmt):
            return None
        table[id(mine_stmt)] = their_stmt.lineno
    return table
