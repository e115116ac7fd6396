"""Structural checks on generated code: patterns compared with the output's syntax tree.

docs/design.md §4 asks tests to assert on structure, not on substrings of generated code. A
*pattern* here is Python source, parsed and compared with the output's AST node by node and
field by field, positions ignored: spacing, quotes and line breaks do not matter, and a name
that merely contains the expected text does not match.

``...`` in a pattern is a wildcard. As an expression it stands for any expression; as an item
of a list (call arguments, tuple items, the statements of a block) it stands for any run of
items, none included; and a call whose arguments hold ``...`` may pass keywords besides those the
pattern names (``mn.create_communicator(...)`` is any call of it). Keywords match by name, in any
order.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator, Sequence

_IGNORED_FIELDS = frozenset({"ctx", "type_comment", "kind"})


def _is_wildcard(node: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def _is_run_wildcard(node: object) -> bool:
    return _is_wildcard(node) or (isinstance(node, ast.Expr) and _is_wildcard(node.value))


def matches(pattern: ast.AST, node: ast.AST) -> bool:
    """Whether ``node`` has the shape of ``pattern`` (see the module docstring)."""
    if _is_wildcard(pattern):
        return True
    if type(pattern) is not type(node):
        return False
    if isinstance(pattern, ast.Call):
        assert isinstance(node, ast.Call)
        return _call_matches(pattern, node)
    return all(
        _value_matches(getattr(pattern, name), getattr(node, name, None))
        for name in pattern._fields
        if name not in _IGNORED_FIELDS
    )


def _value_matches(pattern: object, value: object) -> bool:
    if isinstance(pattern, list):
        return isinstance(value, list) and _sequence_matches(pattern, value)
    if isinstance(pattern, ast.AST):
        return isinstance(value, ast.AST) and matches(pattern, value)
    return type(pattern) is type(value) and pattern == value  # True is not 1


def _sequence_matches(patterns: Sequence[object], values: Sequence[object]) -> bool:
    if not patterns:
        return not values
    first, rest = patterns[0], patterns[1:]
    if _is_run_wildcard(first):
        return any(_sequence_matches(rest, values[i:]) for i in range(len(values) + 1))
    return bool(values) and _value_matches(first, values[0]) and _sequence_matches(rest, values[1:])


def _call_matches(pattern: ast.Call, node: ast.Call) -> bool:
    if not matches(pattern.func, node.func) or not _sequence_matches(pattern.args, node.args):
        return False
    for wanted in pattern.keywords:
        if not any(k.arg == wanted.arg and matches(wanted.value, k.value) for k in node.keywords):
            return False
    open_ended = any(_is_wildcard(a) for a in pattern.args)
    return open_ended or len(pattern.keywords) == len(node.keywords)


def is_statement(stmt: ast.stmt, pattern: str) -> bool:
    """Whether ``stmt`` matches ``pattern``, a single statement."""
    (wanted,) = ast.parse(textwrap.dedent(pattern)).body
    return matches(wanted, stmt)


def index_of(block: Sequence[ast.stmt], pattern: str) -> int:
    """The index of the first statement of ``block`` matching the single statement ``pattern``;
    fails, listing the block, when none does."""
    for i, stmt in enumerate(block):
        if is_statement(stmt, pattern):
            return i
    listing = "\n".join(ast.unparse(s) for s in block)
    raise AssertionError(f"no statement matching\n{textwrap.dedent(pattern)}\namong:\n{listing}")


def _roots(code: str, within: str | None) -> list[ast.AST]:
    """The module, or every function of it named ``within`` (at any depth)."""
    tree = ast.parse(code)
    if within is None:
        return [tree]
    functions: list[ast.AST] = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == within
    ]
    assert functions, f"no function {within}() in:\n{code}"
    return functions


def _blocks(root: ast.AST, top_level: bool) -> Iterator[list[ast.stmt]]:
    for node in [root] if top_level else ast.walk(root):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def find_statements(
    code: str, pattern: str, *, within: str | None = None, top_level: bool = False
) -> list[list[ast.stmt]]:
    """Every run of consecutive statements of one block of ``code`` (or of the functions named
    ``within``) that matches the statements of ``pattern``, in order of the walk.
    ``top_level``: only the module's (or the function's) own statements, not nested blocks."""
    wanted = ast.parse(textwrap.dedent(pattern)).body
    found = []
    for root in _roots(code, within):
        for block in _blocks(root, top_level):
            for start in range(len(block)):
                for end in range(start + 1, len(block) + 1):
                    if _sequence_matches(wanted, block[start:end]):
                        found.append(block[start:end])
                        break
    return found


def find_expressions(code: str, pattern: str, *, within: str | None = None) -> list[ast.expr]:
    """Every expression of ``code`` (or of the functions named ``within``) matching the single
    expression ``pattern``, in order of the walk."""
    wanted = ast.parse(textwrap.dedent(pattern).strip(), mode="eval").body
    return [
        node
        for root in _roots(code, within)
        for node in ast.walk(root)
        if isinstance(node, ast.expr) and matches(wanted, node)
    ]


def contains(code: str, pattern: str) -> bool:
    """Whether ``code`` holds ``pattern``: a lone expression anywhere (a call inside a statement
    counts), anything else as statements of one block."""
    body = ast.parse(textwrap.dedent(pattern)).body
    if len(body) == 1 and isinstance(body[0], ast.Expr):
        return bool(find_expressions(code, pattern))
    return bool(find_statements(code, pattern))


def _where(within: str | None) -> str:
    return f" in {within}()" if within else ""


def assert_has_statement(
    code: str, pattern: str, *, within: str | None = None, top_level: bool = False
) -> list[ast.stmt]:
    """``pattern``'s statements occur, consecutively in one block; returns the first match."""
    found = find_statements(code, pattern, within=within, top_level=top_level)
    assert found, f"no statements matching\n{textwrap.dedent(pattern)}{_where(within)} in:\n{code}"
    return found[0]


def assert_no_statement(
    code: str, pattern: str, *, within: str | None = None, top_level: bool = False
) -> None:
    found = find_statements(code, pattern, within=within, top_level=top_level)
    assert not found, f"unexpected{_where(within)}: {[ast.unparse(s) for s in found[0]]}"


def assert_has_expression(code: str, pattern: str, *, within: str | None = None) -> ast.expr:
    """Some expression matches ``pattern``; returns the first."""
    found = find_expressions(code, pattern, within=within)
    assert found, f"no expression matching {pattern!r}{_where(within)} in:\n{code}"
    return found[0]


def assert_no_expression(code: str, pattern: str, *, within: str | None = None) -> None:
    found = find_expressions(code, pattern, within=within)
    assert not found, f"unexpected{_where(within)}: {ast.unparse(found[0])}"


def names_used(code: str) -> set[str]:
    """Every identifier ``code`` refers to or imports: names, attribute names, and each dotted
    part of imported modules and their aliases (``chainermn`` in ``import chainermn.links``)."""
    used: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.alias):
            used.update(node.name.split("."))
            if node.asname:
                used.add(node.asname)
        elif isinstance(node, ast.ImportFrom) and node.module:
            used.update(node.module.split("."))
    return used


def assert_no_name(code: str, *names: str) -> None:
    """None of ``names`` is referred to or imported (see :func:`names_used`)."""
    present = sorted(set(names) & names_used(code))
    assert not present, f"{present} used in:\n{code}"


def assert_no_keyword(code: str, keyword: str) -> None:
    """No call of ``code`` passes ``keyword=``."""
    calls = [
        n
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Call) and any(k.arg == keyword for k in n.keywords)
    ]
    assert not calls, f"{keyword}= passed in {ast.unparse(calls[0])}"
