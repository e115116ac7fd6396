"""The properties every conversion must keep (docs/design.md §0), as plain functions.

tests/convert/test_properties.py runs them on generated scripts (:mod:`testkit.skeletons`) and
hypothesmith programs at the CI budget; scripts/hypothesis_long.py runs the same ones with a
long budget, files failures by property name (:class:`PropertyFailure`) and reduces them.
:func:`check_skeleton` runs them all, by name (:func:`skeleton_checks`); the test module's
docstring lists what each one means.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import difflib
import io
import json
import os
import subprocess
import symtable
import sys
import textwrap
import tokenize
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from mnify.converter import ConvertOptions, FileResult, convert_source
from mnify.lint import lint_source

REPO = Path(__file__).resolve().parents[1]
PATH = "train.py"
DEADLOCK_RULES = ("MN301", "MN302")
# ----------------------------------------------------------------------------- conversion

DEFAULT = ConvertOptions()
_cache: dict[tuple[str, ConvertOptions], FileResult] = {}


def converted(source: str, options: ConvertOptions = DEFAULT) -> FileResult:
    """``convert_source`` memoised by text: the skeleton tests share one conversion each."""
    result = _cache.get((source, options))
    if result is None:
        if len(_cache) > 256:
            _cache.clear()
        result = _cache[(source, options)] = convert_source(source, PATH, options)
    return result


def accepted_output(source: str) -> str | None:
    """The output of a conversion that succeeded, else None: those examples are
    ``test_skeleton_converts_without_error``'s business (one property a test). Not ``assume``:
    rejecting examples would change which scripts the other tests draw and lose the cache."""
    result = converted(source)
    return result.output if result.error is None else None


def check_converts(source: str, options: ConvertOptions = DEFAULT) -> str:
    """No exception, no error, output compiles. Returns the output."""
    result = converted(source, options)
    assert result.error is None, f"convert reported an error: {result.error}"
    assert result.output is not None, "convert gave no output and no error"
    compile(result.output, PATH, "exec", dont_inherit=True)
    return result.output


# ------------------------------------------------------------------------ structure oracle


def is_rank0_test(test: ast.expr) -> bool:
    """``<anything>.rank == 0``."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Attribute)
        and test.left.attr == "rank"
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == 0
    )


def _is_none(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Tuple):
        return all(_is_none(e) for e in expr.elts)
    return isinstance(expr, ast.Constant) and expr.value is None


def is_guard(stmt: ast.stmt) -> bool:
    """A rank-0 ``if`` the converter may have added: no ``else`` but ``names = None, ...``."""
    return (
        isinstance(stmt, ast.If)
        and is_rank0_test(stmt.test)
        and all(isinstance(s, ast.Assign) and _is_none(s.value) for s in stmt.orelse)
    )


def callee(expr: ast.expr) -> str:
    """The dotted path of a call chain without arguments: ``cuda.get_device_from_id().use``."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return f"{callee(expr.value)}.{expr.attr}"
    if isinstance(expr, ast.Call):
        return f"{callee(expr.func)}()"
    if isinstance(expr, ast.Subscript):
        return f"{callee(expr.value)}[]"
    return type(expr).__name__


def signature(stmt: ast.stmt) -> tuple[object, ...]:
    """What must survive conversion of a statement itself (expressions may be replaced)."""
    d = ast.dump
    if isinstance(stmt, ast.Assign):
        return ("Assign", tuple(d(t) for t in stmt.targets))
    if isinstance(stmt, ast.AugAssign):
        return ("AugAssign", d(stmt.target), type(stmt.op).__name__)
    if isinstance(stmt, ast.AnnAssign):
        return ("AnnAssign", d(stmt.target))
    if isinstance(stmt, ast.Expr):
        if isinstance(stmt.value, ast.Call):
            return ("Call", callee(stmt.value.func))
        return ("Expr", d(stmt.value))
    if isinstance(stmt, (ast.If, ast.While)):
        return (type(stmt).__name__, d(stmt.test))
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return (type(stmt).__name__, d(stmt.target), callee(stmt.iter))
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return (type(stmt).__name__, tuple(callee(i.context_expr) for i in stmt.items))
    if isinstance(stmt, (ast.Try, ast.TryStar)):
        handlers = tuple((d(h.type) if h.type else None, h.name) for h in stmt.handlers)
        return (type(stmt).__name__, handlers, bool(stmt.orelse), bool(stmt.finalbody))
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        # docs/design.md §0: no rewrite changes a signature
        return ("def", stmt.name, d(stmt.args), tuple(d(x) for x in stmt.decorator_list))
    if isinstance(stmt, ast.ClassDef):
        return ("class", stmt.name, tuple(d(b) for b in stmt.bases))
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return (d(stmt),)
    return (type(stmt).__name__,)


def child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    blocks: list[list[ast.stmt]] = []
    for attribute in ("body", "orelse", "finalbody"):
        value = getattr(stmt, attribute, None)
        if isinstance(value, list):
            blocks.append(value)
        if attribute == "body":
            blocks += [h.body for h in getattr(stmt, "handlers", [])]
            blocks += [c.body for c in getattr(stmt, "cases", [])]
    return blocks


def _same(original: ast.stmt, new: ast.stmt) -> bool:
    if signature(original) != signature(new):
        return False
    pairs = zip(child_blocks(original), child_blocks(new), strict=True)
    return all(_embed(a, b) == len(a) for a, b in pairs)


def _embed(original: list[ast.stmt], new: list[ast.stmt]) -> int:
    """How many of ``original`` appear in order in ``new`` (added rank-0 guards see-through)."""
    k = 0
    for stmt in new:
        if k == len(original):
            break
        if _same(original[k], stmt):
            k += 1
        elif is_guard(stmt):
            k += _embed(original[k:], stmt.body)
    return k


def _flat(new: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in new:
        yield stmt
        if is_guard(stmt):
            yield from _flat(stmt.body)


def _first_loss(original: list[ast.stmt], new: list[ast.stmt]) -> ast.stmt | None:
    """The innermost original statement that did not survive (for the failure message)."""
    k = _embed(original, new)
    if k == len(original):
        return None
    lost = original[k]
    for candidate in _flat(new):
        if signature(candidate) != signature(lost):
            continue
        for a, b in zip(child_blocks(lost), child_blocks(candidate), strict=True):
            deeper = _first_loss(a, b)
            if deeper is not None:
                return deeper
    return lost


def check_structure(source: str, output: str) -> None:
    """Every original statement is still there, in order, under the same enclosing blocks."""
    original = ast.parse(source).body
    lost = _first_loss(original, ast.parse(output).body)
    if lost is not None:
        text = ast.unparse(lost).splitlines()[0]
        raise AssertionError(
            f"input line {lost.lineno} `{text}` is missing, moved or re-nested in the output"
        )


# ------------------------------------------------------------ data is scattered after load


def _names(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _ends_block(body: list[ast.stmt]) -> bool:
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Raise, ast.Return, ast.Continue, ast.Break)):
        return True
    return (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and callee(last.value.func) in ("sys.exit", "exit", "quit")
    )


def binds(stmt: ast.stmt, name: str) -> bool:
    """``stmt`` assigns ``name`` on every path through it that falls through."""
    if isinstance(stmt, ast.Assign):
        return any(name in _names(t) for t in stmt.targets)
    if isinstance(stmt, ast.AnnAssign):
        return stmt.value is not None and name in _names(stmt.target)
    if isinstance(stmt, ast.If):
        return block_binds(stmt.body, name) and block_binds(stmt.orelse, name)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return block_binds(stmt.body, name)
    if isinstance(stmt, ast.Try):
        if block_binds(stmt.finalbody, name):
            return True
        body = block_binds(stmt.body, name) or block_binds(stmt.orelse, name)
        return body and all(block_binds(h.body, name) or _ends_block(h.body) for h in stmt.handlers)
    return False


def block_binds(body: list[ast.stmt], name: str) -> bool:
    return any(binds(s, name) for s in body) or _ends_block(body)


Chain = tuple[tuple[list[ast.stmt], int, ast.stmt | None], ...]
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def walk_statements(
    body: list[ast.stmt], chain: Chain = (), into_defs: bool = True
) -> Iterator[tuple[ast.stmt, Chain]]:
    """Every statement with its chain of (block, index, owner of the next level) above it."""
    for i, stmt in enumerate(body):
        yield stmt, chain + ((body, i, None),)
        if not into_defs and isinstance(stmt, _DEFS):
            continue
        for block in child_blocks(stmt):
            yield from walk_statements(block, chain + ((body, i, stmt),), into_defs)


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}


def bound_before(name: str, chain: Chain) -> bool:
    """``name`` is assigned on every path to the statement the chain leads to (same scope)."""
    for block, index, owner in reversed(chain):
        if any(binds(s, name) for s in block[:index]):
            return True
        if isinstance(owner, (ast.For, ast.AsyncFor)) and name in _names(owner.target):
            return True
        if isinstance(owner, (ast.With, ast.AsyncWith)) and any(
            i.optional_vars is not None and name in _names(i.optional_vars) for i in owner.items
        ):
            return True
        if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return name in _params(owner)
    return False


def check_scatter_after_assignment(output: str) -> None:
    """Each ``scatter_dataset(x, ...)`` is reached only after ``x`` was assigned."""
    for stmt, chain in walk_statements(ast.parse(output).body):
        if not isinstance(stmt, (ast.Assign, ast.Expr)):
            continue
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Call)
                and callee(node.func).endswith("scatter_dataset")
                and node.args
                and isinstance(node.args[0], ast.Name)
            ):
                name = node.args[0].id
                assert bound_before(name, chain), (
                    f"output line {stmt.lineno} scatters `{name}` before it is assigned"
                )


# ------------------------------------------------- the communicator exists where it is used


def _header(stmt: ast.stmt) -> list[ast.AST]:
    """The expressions a statement itself evaluates (a compound one: its header only)."""
    if isinstance(stmt, (ast.If, ast.While)):
        return [stmt.test]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.iter]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [i.context_expr for i in stmt.items]
    if isinstance(stmt, ast.Try):
        return [h.type for h in stmt.handlers if h.type is not None]
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        defaults = [d for d in stmt.args.kw_defaults if d is not None]
        return [*stmt.decorator_list, *stmt.args.defaults, *defaults]
    if isinstance(stmt, ast.ClassDef):
        return [*stmt.decorator_list, *stmt.bases]
    if isinstance(stmt, ast.Match):
        return [stmt.subject]
    return [stmt]


def _uses(stmt: ast.stmt) -> tuple[set[str], set[str]]:
    """(names the statement loads now, names of functions it calls by plain name)."""
    loads: set[str] = set()
    calls: set[str] = set()
    todo = list(_header(stmt))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Lambda, *_DEFS)):
            continue  # runs later, if at all
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loads.add(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls.add(node.func.id)
        todo.extend(ast.iter_child_nodes(node))
    return loads, calls


def _locals(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    found = _params(func)
    for stmt, _ in walk_statements(func.body, into_defs=False):
        if isinstance(stmt, ast.Assign):
            found |= {n for t in stmt.targets for n in _names(t)}
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            found |= _names(stmt.target)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            found |= _names(stmt.target)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            found |= {n for i in stmt.items if i.optional_vars for n in _names(i.optional_vars)}
        elif isinstance(stmt, _DEFS):
            found.add(stmt.name)
    return found


Func = ast.FunctionDef | ast.AsyncFunctionDef


def check_comm_bound(output: str) -> None:
    """Every use of the communicator happens where it exists: a function's own ``comm`` after
    its assignment (or as a parameter), also when a closure defined in it reads it; a
    module-level ``comm`` before any call that reaches a function reading it as a global (no
    NameError, no use before creation)."""
    tree = ast.parse(output)
    comms = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Call)
        and callee(n.value.func).endswith("create_communicator")
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    if not comms:
        return
    parent: dict[int, Func | None] = {}  # function -> the function it is defined in

    def index(body: list[ast.stmt], owner: Func | None) -> None:
        for stmt, _ in walk_statements(body, into_defs=False):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                parent[id(stmt)] = owner
                index(stmt.body, stmt)
            elif isinstance(stmt, ast.ClassDef):
                index(stmt.body, owner)

    index(tree.body, None)
    functions = [
        f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    local = {id(f): _locals(f) for f in functions}

    def owner_of(name: str, f: Func | None) -> Func | None:
        """The function whose local ``name`` is, seen from ``f`` (None: the module)."""
        while f is not None:
            if name in local[id(f)]:
                return f
            f = parent[id(f)]
        return None

    def resolve(call: str, f: Func | None) -> Func | None:
        """The function a plain-name call in ``f`` reaches (nested defs first)."""
        scope = f
        while True:
            for g in functions:
                if g.name == call and parent[id(g)] is scope:
                    return g
            if scope is None:
                return None
            scope = parent[id(scope)]

    # needs[f]: (communicator name, function owning it or None for the module) that calling
    # f reads, for owners other than f itself
    needs: dict[int, set[tuple[str, int | None]]] = {id(f): set() for f in functions}
    grew = True
    while grew:
        grew = False
        for f in functions:
            want = set(needs[id(f)])
            for stmt, _ in walk_statements(f.body, into_defs=False):
                loads, calls = _uses(stmt)
                for name in loads & comms:
                    owner = owner_of(name, f)
                    if owner is not f:
                        want.add((name, None if owner is None else id(owner)))
                for c in calls:
                    g = resolve(c, f)
                    if g is not None:
                        want |= {n for n in needs[id(g)] if n[1] != id(f)}
            if want != needs[id(f)]:
                needs[id(f)] = want
                grew = True

    def wanted(stmt: ast.stmt, f: Func | None) -> set[str]:
        """Communicators ``stmt`` (in ``f``; None: module level) needs from ``f``'s scope."""
        loads, calls = _uses(stmt)
        here = None if f is None else id(f)
        out = {n for n in loads & comms if owner_of(n, f) is f}
        for c in calls:
            g = resolve(c, f)
            if g is not None:
                out |= {n for n, owner in needs[id(g)] if owner == here}
        return out

    for stmt, chain in walk_statements(tree.body, into_defs=False):
        for name in sorted(wanted(stmt, None)):
            assert bound_before(name, chain), (
                f"output line {stmt.lineno} uses `{name}` (module level) before it exists"
            )
    for f in functions:
        for stmt, chain in walk_statements(f.body, (([], 0, f),), into_defs=False):
            for name in sorted(wanted(stmt, f)):
                assert bound_before(name, chain), (
                    f"output line {stmt.lineno} uses `{name}` in {f.name}() before it exists"
                )


def undefined_globals(text: str) -> set[str]:
    """Names some scope reads as globals that the module never binds (nor builtins has)."""
    top = symtable.symtable(text, PATH, "exec")
    bound = {
        s.get_name()
        for s in top.get_symbols()
        if s.is_assigned() or s.is_imported() or s.is_namespace()
    }
    missing: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for symbol in table.get_symbols():
            name = symbol.get_name()
            global_read = symbol.is_global() or table is top
            if symbol.is_referenced() and global_read and name not in bound:
                if not hasattr(builtins, name) and name != "__file__":
                    missing.add(name)
    return missing


def check_no_new_undefined_name(source: str, output: str) -> None:
    new = undefined_globals(output) - undefined_globals(source)
    assert not new, f"the output reads names nothing defines: {sorted(new)}"


def nested_guards(text: str) -> list[int]:
    """Lines of ``if <x>.rank == 0:`` inside another one (same function): a redundant guard."""
    found: list[int] = []

    def walk(node: ast.AST, guarded: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                walk(child, False)
            elif isinstance(child, ast.If) and is_rank0_test(child.test):
                if guarded:
                    found.append(child.lineno)
                for stmt in child.body:
                    walk_stmt(stmt, True)
                for stmt in child.orelse:
                    walk_stmt(stmt, guarded)
            else:
                walk(child, guarded)

    def walk_stmt(stmt: ast.stmt, guarded: bool) -> None:
        wrapper = ast.Module(body=[stmt], type_ignores=[])
        walk(wrapper, guarded)

    walk(ast.parse(text), False)
    return found


def check_no_nested_guard(source: str, output: str) -> None:
    """No rank-0 guard is added inside code that already runs on rank 0 only."""
    added = len(nested_guards(output)) - len(nested_guards(source))
    assert added <= 0, (
        f"rank-0 guards nested in rank-0 guards at output lines {nested_guards(output)}"
    )


# ------------------------------------------- no collective behind a rank-0 guard (deep)
# MN301 sees collectives on names it can resolve; this follows multi-node objects into the
# user's helper functions through their parameters (``report(evaluator)`` calling
# ``evaluator()``), which is where a guarded call can still hide a collective.

_MAKES_COLLECTIVE = (
    "create_multi_node_evaluator",
    "create_multi_node_optimizer",
    "create_communicator",
    "Trainer",
    "create_multi_node_iterator",
)
_COLLECTIVE_METHODS = frozenset(
    """update evaluate run barrier bcast bcast_obj bcast_data gather gather_obj allgather
    allreduce allreduce_obj all_reduce alltoall scatter multi_node_mean_grad split""".split()
)


def _collective_values(tree: ast.Module) -> set[str]:
    """Names assigned a multi-node object anywhere (evaluator, optimizer, comm, trainer)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if callee(node.value.func).split(".")[-1] in _MAKES_COLLECTIVE:
                found |= {n for t in node.targets for n in _names(t)}
    return found


def _reaches_collective(
    nodes: list[ast.AST],
    values: set[str],
    functions: dict[str, ast.FunctionDef],
    seen: set[tuple[str, frozenset[str]]],
) -> ast.Call | None:
    """The first call in ``nodes`` that is, or leads through a local function to, a collective
    (``values``: names holding multi-node objects here)."""
    todo = list(nodes)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Lambda, *_DEFS)):
            continue
        todo.extend(ast.iter_child_nodes(node))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = callee(func).split(".")[-1]
        if isinstance(func, ast.Name) and func.id in values:
            return node  # calling a multi-node evaluator
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in values and func.attr in _COLLECTIVE_METHODS:
                return node
        if name in ("scatter_dataset", "scatter_index"):
            return node
        target = functions.get(func.id) if isinstance(func, ast.Name) else None
        if target is None:
            continue
        params = [a.arg for a in (*target.args.posonlyargs, *target.args.args)]
        passed = {
            params[i]
            for i, a in enumerate(node.args)
            if i < len(params) and isinstance(a, ast.Name) and a.id in values
        }
        passed |= {
            k.arg
            for k in node.keywords
            if k.arg is not None and isinstance(k.value, ast.Name) and k.value.id in values
        }
        inner = (values - _params(target)) | passed
        key = (target.name, frozenset(inner))
        if key in seen:
            continue
        seen.add(key)
        if _reaches_collective(list(target.body), inner, functions, seen) is not None:
            return node
    return None


def check_no_collective_under_guard(source: str, output: str) -> None:
    """No added ``if comm.rank == 0:`` body reaches a collective, directly or in a helper."""
    if output == source:
        return
    tree = ast.parse(output)
    values = _collective_values(tree)
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    had = sum(isinstance(n, ast.If) and is_rank0_test(n.test) for n in ast.walk(ast.parse(source)))
    if had:
        return  # a distributed input: its own guards are MN301's business
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and is_rank0_test(node.test):
            call = _reaches_collective(list(node.body), values, functions, set())
            assert call is None, (
                f"output line {call.lineno}: `{ast.unparse(call)}` reaches a collective but "
                f"runs only on rank 0 (guard at line {node.lineno})"
            )


def comments(text: str) -> list[str]:
    """The comment texts of a source file, in order."""
    return [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]


def check_comments_kept(source: str, output: str) -> None:
    """Every comment of the input is still in the output, in order (docs/design.md §1:
    comments outside edited nodes are kept)."""
    kept = iter(comments(output))
    for comment in comments(source):
        assert any(c == comment for c in kept), f"comment {comment!r} is lost or moved"


# ------------------------------------------------------------------------- deadlock lint


_lint_cache: dict[str, Counter[tuple[str, str]]] = {}


def deadlock_findings(source: str) -> Counter[tuple[str, str]]:
    """MN301/MN302 findings keyed by code and the flagged source text (lines shift)."""
    found = _lint_cache.get(source)
    if found is not None:
        return found
    lines = source.splitlines()
    found = Counter()
    for d in lint_source(source, PATH, select=list(DEADLOCK_RULES)):
        if d.line == d.end_line:
            text = lines[d.line - 1][d.col - 1 : d.end_col - 1]
        else:
            text = lines[d.line - 1][d.col - 1 :]
        found[(d.code, text.strip())] += 1
    if len(_lint_cache) > 256:
        _lint_cache.clear()
    _lint_cache[source] = found
    return found


def check_no_new_deadlock(
    source: str, output: str, codes: tuple[str, ...] = DEADLOCK_RULES
) -> None:
    """No MN301 (a collective only some ranks reach: a hang) or MN302 (rank-divergent work
    before a timed collective) finding in the output that the input lacked."""
    new = deadlock_findings(output) - deadlock_findings(source)
    new = Counter({key: n for key, n in new.items() if key[0] in codes})
    assert not new, f"the output has deadlock findings the input lacked: {sorted(new)}"


# --------------------------------------------------------- idempotence and determinism


# Converting output again must change nothing because the rewrites are idempotent, not because
# the driver leaves already-distributed files alone (the default): that shortcut is switched off
# for output the converter wrote. Input it left alone is checked with the options as given.
REWRITES_ONLY = ConvertOptions(leave_distributed=False)


def check_idempotent(source: str, output: str, options: ConvertOptions = DEFAULT) -> None:
    if output != source:
        options = dataclasses.replace(options, leave_distributed=False)
    again = convert_source(output, PATH, options)
    assert again.error is None, f"converting the output failed: {again.error}"
    if again.output != output:
        diff = difflib.unified_diff(
            output.splitlines(keepends=True), (again.output or "").splitlines(keepends=True), n=1
        )
        raise AssertionError("converting the output changed it again:\n" + "".join(diff))


def check_deterministic(source: str, output: str, options: ConvertOptions = DEFAULT) -> None:
    fresh = convert_source(source, PATH, options)  # not the cache: a second, independent run
    assert fresh.error is None
    assert fresh.output == output, "a second conversion in the same process gave other text"


def exercised(source: str, output: str) -> tuple[bool, bool]:
    """Whether the output gained a rank-0 guard and a ``scatter_dataset`` the input lacked."""

    def counts(text: str) -> tuple[int, int]:
        tree = ast.parse(text)
        guards = sum(isinstance(n, ast.If) and is_rank0_test(n.test) for n in ast.walk(tree))
        scatters = sum(
            isinstance(n, ast.Call) and callee(n.func).endswith("scatter_dataset")
            for n in ast.walk(tree)
        )
        return guards, scatters

    (g_in, s_in), (g_out, s_out) = counts(source), counts(output)
    return g_out > g_in, s_out > s_in


class PropertyFailure(AssertionError):
    """A property that failed, by name (``scripts/hypothesis_long.py`` files failures by it)."""

    def __init__(self, prop: str, detail: str) -> None:
        super().__init__(f"{prop}: {detail}")
        self.prop = prop
        self.detail = detail


def skeleton_checks(
    source: str, options: ConvertOptions = DEFAULT
) -> dict[str, Callable[[str], None]]:
    """The skeleton properties by name, each a check of the output (``converts`` made it)."""
    return {
        "converts": lambda out: None,
        "structure": lambda out: check_structure(source, out),
        "scatter-order": check_scatter_after_assignment,
        "comm-bound": check_comm_bound,
        "no-new-undefined-name": lambda out: check_no_new_undefined_name(source, out),
        "no-nested-guard": lambda out: check_no_nested_guard(source, out),
        "comments-kept": lambda out: check_comments_kept(source, out),
        "no-new-deadlock": lambda out: check_no_new_deadlock(source, out),
        "no-guarded-collective": lambda out: check_no_collective_under_guard(source, out),
        "idempotent": lambda out: check_idempotent(source, out, options),
        "deterministic": lambda out: check_deterministic(source, out, options),
    }


def check_skeleton(source: str, only: str | None = None, options: ConvertOptions = DEFAULT) -> None:
    """Every skeleton property in turn (or ``converts`` and ``only``) under ``options``;
    raises :class:`PropertyFailure` at the first failure."""
    try:
        output = check_converts(source, options)
    except Exception as exc:
        raise PropertyFailure("converts", f"{type(exc).__name__}: {exc}") from exc
    for prop, check in skeleton_checks(source, options).items():
        if only is not None and prop != only:
            continue
        try:
            check(output)
        except Exception as exc:
            raise PropertyFailure(prop, f"{type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------- programs from hypothesmith


def check_arbitrary_program(source: str) -> None:
    """hypothesmith programs: no crash, no internal error, output compiles, idempotent."""
    result = convert_source(source, PATH)
    assert result.error is None or "internal" not in result.error, result.error
    if result.output is None:
        return
    compile(result.output, PATH, "exec", dont_inherit=True)
    options = REWRITES_ONLY if result.output != source else None
    again = convert_source(result.output, PATH, options)
    assert again.output == result.output, "converting the output changed it again"


# ------------------------------------------------------------ determinism across processes

_WORKER = textwrap.dedent(
    """
    import json, sys
    from mnify.converter import convert_source
    sources = json.load(open(sys.argv[1]))
    out = []
    for text in sources:
        r = convert_source(text, "train.py")
        out.append([r.output, r.error])
    json.dump(out, sys.stdout)
    """
)

CROSS_PROCESS_ENVS = {
    "hashseed-0": {"PYTHONHASHSEED": "0"},
    "hashseed-999": {"PYTHONHASHSEED": "999"},
    "malloc": {"PYTHONMALLOC": "malloc"},
}


def convert_in_subprocesses(
    sources: list[str], workdir: Path, envs: dict[str, dict[str, str]]
) -> dict[str, list[list[str | None]]]:
    """Convert ``sources`` in one fresh interpreter per environment (run side by side)."""
    data = workdir / "sources.json"
    data.write_text(json.dumps(sources), encoding="utf-8")
    running = {}
    for label, extra in envs.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(extra, PYTHONPATH=str(REPO))
        running[label] = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(data)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for label, proc in running.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{label} worker failed:\n{stderr}"
        results[label] = json.loads(stdout)
    return results
