"""The output check: a converted file may differ from its input only as its plan says.

Like black's ``--safe``, every conversion is checked before anything is written. This module
shares no code with the applier (``edits.ApplyEdits``): it reads the input and the output with
Python's own ``ast`` and the plan only as records (what kind of edit, at which original line),
so a bug in the applier cannot hide in the check. It walks both trees block by block and
requires that

- every original statement is still there, in order, under the same chain of enclosing blocks;
- a statement differs from its original only where the plan replaces an expression in it
  (and then keeps its kind and its own blocks, which are checked in turn);
- an ``if <comm>.rank == 0:`` that the input lacks wraps only statements the plan guards (an
  ``else`` only the planned ``a, b = None, None``);
- every other new statement is one the plan inserts, and every planned insertion is there.

Statements are identified by their first line and kind (the keyword line of a compound
statement, as ``ast`` reports it).

The report's claims are checked the same way (:func:`check_claims`): an entry that says a
statement runs on rank 0, or that a dataset is scattered, must be borne out by the output.
"""

from __future__ import annotations

import ast
import copy
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NoReturn

# An original statement: (1-based line, kind) with kinds spelled as below.
StmtKey = tuple[int, str]

_KIND_ALIASES = {"Delete": "Del", "TryStar": "Try"}
_BLOCK_FIELDS = ("body", "orelse", "finalbody")


def kind_name(name: str) -> str:
    """One spelling for statement kinds across ``ast`` and libcst (``AsyncFor`` is ``For``)."""
    name = name.removeprefix("Async")
    return _KIND_ALIASES.get(name, name)


@dataclass(frozen=True)
class ClaimRecord:
    """What one report entry says the output shows: ``guarded`` — the statement whose code is
    ``subject`` runs under the rank-0 guard; ``scattered`` — the dataset named ``subject``
    reaches ``scatter_dataset`` (or ``scatter_index``); ``rank0-loads`` — rank 0 binds the name
    ``subject`` and the others bind None."""

    line: int
    message: str
    kind: Literal["guarded", "scattered", "rank0-loads"]
    subject: str


@dataclass
class PlanRecords:
    """What the plan changes, as the check sees it (no nodes, only lines, kinds and code)."""

    guard_test: str = "comm.rank == 0"
    guarded: dict[StmtKey, tuple[str, ...]] = field(default_factory=dict)  # -> else names
    replaced: set[StmtKey] = field(default_factory=set)
    inserted: list[str] = field(default_factory=list)  # code of each inserted statement
    claims: list[ClaimRecord] = field(default_factory=list)  # the report's, in report order


class VerificationError(Exception):
    """The output differs from the input in a way the plan does not account for."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"{line}: {message}")
        self.line = line
        self.message = message


def _dump(node: ast.AST) -> str:
    return ast.dump(node, annotate_fields=True, include_attributes=False)


def _describe(stmt: ast.stmt) -> str:
    text = ast.unparse(_header(stmt)).splitlines()[0] if _blocks(stmt) else ast.unparse(stmt)
    text = " ".join(text.split())
    return f"`{text[:60]}{'...' if len(text) > 60 else ''}`"


def _blocks(stmt: ast.stmt) -> list[tuple[str, list[ast.stmt]]]:
    """The statement lists a compound statement holds, labelled."""
    out: list[tuple[str, list[ast.stmt]]] = []
    for name in _BLOCK_FIELDS:
        value = getattr(stmt, name, None)
        if isinstance(value, list) and (value or name == "body"):
            out.append((name, value))
    for n, handler in enumerate(getattr(stmt, "handlers", ()) or ()):
        out.append((f"handler{n}", handler.body))
    for n, case in enumerate(getattr(stmt, "cases", ()) or ()):
        out.append((f"case{n}", case.body))
    return out if any(isinstance(stmt, t) for t in _COMPOUND) else []


_COMPOUND: tuple[type[ast.stmt], ...] = (
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Match,
    *((ast.TryStar,) if hasattr(ast, "TryStar") else ()),
)


def _header(stmt: ast.stmt) -> ast.stmt:
    """A copy of a compound statement with its blocks emptied (what its own line says)."""
    head = copy.copy(stmt)
    for name in _BLOCK_FIELDS:
        if isinstance(getattr(head, name, None), list):
            setattr(head, name, [ast.Pass()] if name == "body" else [])
    if getattr(head, "handlers", None):
        head.handlers = [  # type: ignore[attr-defined]
            ast.ExceptHandler(type=h.type, name=h.name, body=[ast.Pass()])
            for h in stmt.handlers  # type: ignore[attr-defined]
        ]
    if getattr(head, "cases", None):
        head.cases = [  # type: ignore[attr-defined]
            ast.match_case(pattern=c.pattern, guard=c.guard, body=[ast.Pass()])
            for c in stmt.cases  # type: ignore[attr-defined]
        ]
    return head


def _targets(stmt: ast.stmt) -> str:
    """What a statement binds (assignment targets), which a planned replacement never changes."""
    targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
    return "|".join(_dump(t) for t in targets if t is not None)


def _units(stmts: Sequence[ast.stmt]) -> list[list[ast.stmt]]:
    """Statements grouped as source lines hold them: ``a = 1; b = 2`` is one unit."""
    units: list[list[ast.stmt]] = []
    for stmt in stmts:
        simple = not _blocks(stmt)
        if (
            simple
            and units
            and not _blocks(units[-1][0])
            and units[-1][0].lineno == stmt.lineno
            and units[-1][-1].end_lineno == stmt.lineno
        ):
            units[-1].append(stmt)
        else:
            units.append([stmt])
    return units


def _keys(unit: list[ast.stmt]) -> list[StmtKey]:
    first = unit[0]
    keys = [(first.lineno, kind_name(type(first).__name__))]
    decorators = getattr(first, "decorator_list", None)
    if decorators:  # a libcst position may name the first decorator's line instead
        keys.append((decorators[0].lineno, keys[0][1]))
    return keys


class _Checker:
    def __init__(self, records: PlanRecords, source: ast.Module, output: ast.Module) -> None:
        self.records = records
        self.test = _dump(ast.parse(records.guard_test, mode="eval").body)
        self.pending: Counter[str] = Counter()
        for code in records.inserted:
            for unit in _units(ast.parse(code).body):
                self.pending[self._unit_dump(unit)] += 1
        self.source = source
        self.output = output

    @staticmethod
    def _unit_dump(unit: list[ast.stmt]) -> str:
        return "\n".join(_dump(s) for s in unit)

    _full_dump = _unit_dump  # a compound statement's dump holds its blocks too

    def _has(self, unit: list[ast.stmt], keys: Iterable[StmtKey]) -> bool:
        return any(k in keys for k in _keys(unit))

    def _guarded(self, unit: list[ast.stmt]) -> tuple[str, ...] | None:
        for k in _keys(unit):
            if k in self.records.guarded:
                return self.records.guarded[k]
        return None

    def _is_guard(self, unit: list[ast.stmt]) -> bool:
        stmt = unit[0]
        return len(unit) == 1 and isinstance(stmt, ast.If) and _dump(stmt.test) == self.test

    def block(self, orig: Sequence[ast.stmt], out: Sequence[ast.stmt], chain: list[str]) -> None:
        o_units, u_units = _units(orig), _units(out)
        i = j = 0
        while i < len(o_units) or j < len(u_units):
            o = o_units[i] if i < len(o_units) else None
            u = u_units[j] if j < len(u_units) else None
            if (
                o is not None
                and u is not None
                and self._is_guard(u)
                and self._guarded(o) is not None
            ):
                guard = u[0]
                assert isinstance(guard, ast.If)
                under = chain + [_describe(guard)]
                names: tuple[str, ...] = ()
                for piece in _units(guard.body):
                    if i >= len(o_units):
                        self._fail_unplanned(piece, under)
                    o = o_units[i]
                    got = self._guarded(o)
                    if got is None:
                        here = " > ".join(chain) or "the module"
                        raise VerificationError(
                            o[0].lineno,
                            f"{_describe(o[0])} moved from under {here} to under "
                            f"{' > '.join(under)} (an unplanned rank guard)",
                        )
                    names = (*names, *(n for n in got if n not in names))
                    self.compare(o, piece, under)
                    i += 1
                self._check_else(guard, names)
                j += 1
                continue
            if (
                u is not None
                and self.pending[self._unit_dump(u)] > 0
                and (o is None or self._full_dump(o) != self._full_dump(u))
            ):
                self.pending[self._unit_dump(u)] -= 1
                j += 1
                continue
            if (
                o is not None
                and u is not None
                and self._guarded(o) is None
                and self._same_place(o, u)
            ):
                self.compare(o, u, chain)
                i += 1
                j += 1
                continue
            if o is not None and self._guarded(o) is not None:
                raise VerificationError(
                    o[0].lineno, f"{_describe(o[0])} lost its planned rank guard"
                )
            if o is not None:
                if u is not None and self._where(o) == chain:
                    self._fail_unplanned(u, chain)  # o is still here, later: u is the stranger
                self._fail_missing(o, chain)
            assert u is not None
            self._fail_unplanned(u, chain)

    def _same_place(self, o: list[ast.stmt], u: list[ast.stmt]) -> bool:
        """``u`` is ``o``: unchanged, or changed by a planned replacement that kept its kind and
        what it assigns."""
        if [type(s) for s in o] != [type(s) for s in u]:
            return False
        if self._has(o, self.records.replaced):
            return all(_targets(a) == _targets(b) for a, b in zip(o, u, strict=True))
        if _blocks(o[0]):
            return _dump(_header(o[0])) == _dump(_header(u[0]))
        return self._unit_dump(o) == self._unit_dump(u)

    def compare(self, o: list[ast.stmt], u: list[ast.stmt], chain: list[str]) -> None:
        if not self._same_place(o, u):
            self._fail_missing(o, chain)
        if _blocks(o[0]):
            theirs = dict(_blocks(u[0]))
            for label, body in _blocks(o[0]):
                self.block(body, theirs.get(label, []), chain + [_describe(o[0])])
            extra = set(theirs) - {label for label, _ in _blocks(o[0])}
            if extra:
                raise VerificationError(
                    o[0].lineno, f"{_describe(o[0])} gained a block ({', '.join(sorted(extra))})"
                )

    def _check_else(self, guard: ast.If, names: tuple[str, ...]) -> None:
        if not names:
            if guard.orelse:
                raise VerificationError(guard.lineno, "a rank-0 guard gained an unplanned else")
            return
        want = f"{', '.join(names)} = {', '.join('None' for _ in names)}"
        if len(guard.orelse) != 1 or _dump(guard.orelse[0]) != _dump(ast.parse(want).body[0]):
            raise VerificationError(guard.lineno, f"a loading guard's else is not `{want}`")

    def _where(self, unit: list[ast.stmt], tree: ast.Module | None = None) -> list[str] | None:
        """The chain of blocks under which an equal statement sits in ``tree`` (the output by
        default), if any."""
        want = self._unit_dump(unit)

        def search(stmts: Sequence[ast.stmt], chain: list[str]) -> list[str] | None:
            for piece in _units(stmts):
                if self._unit_dump(piece) == want:
                    return chain
                for _, body in _blocks(piece[0]):
                    found = search(body, chain + [_describe(piece[0])])
                    if found is not None:
                        return found
            return None

        return search((tree or self.output).body, [])

    def _fail_missing(self, o: list[ast.stmt], chain: list[str]) -> NoReturn:
        where = self._where(o)
        here = " > ".join(chain) or "the module"
        if where is None:
            raise VerificationError(o[0].lineno, f"{_describe(o[0])} lost from under {here}")
        raise VerificationError(
            o[0].lineno,
            f"{_describe(o[0])} moved from under {here} to under {' > '.join(where) or 'the module'}",
        )

    def _fail_unplanned(self, u: list[ast.stmt], chain: list[str]) -> NoReturn:
        here = " > ".join(chain) or "the module"
        came_from = self._where(u, self.source)
        if came_from is not None and came_from != chain:
            raise VerificationError(
                u[0].lineno,
                f"{_describe(u[0])} moved from under {' > '.join(came_from) or 'the module'} "
                f"to under {here}",
            )
        raise VerificationError(
            u[0].lineno, f"output line {u[0].lineno}: unplanned {_describe(u[0])} under {here}"
        )

    def finish(self) -> None:
        missing = [d for d, n in self.pending.items() if n > 0]
        if missing:
            raise VerificationError(
                1, f"{len(missing)} planned insertion(s) missing from the output"
            )


def check_output(
    source: str, output: str, records: PlanRecords, orig_tree: ast.Module | None = None
) -> None:
    """Raise :class:`VerificationError` unless ``output`` is ``source`` changed only as planned
    (``orig_tree``: ``source``'s syntax tree, when the caller has it already)."""
    if orig_tree is None:
        orig_tree = ast.parse(source)
    out_tree = ast.parse(output)
    checker = _Checker(records, orig_tree, out_tree)
    checker.block(orig_tree.body, out_tree.body, [])
    checker.finish()


def _signature(stmt: ast.stmt) -> str:
    """What identifies a statement across planned expression replacements: the callee of an
    expression statement, the targets of an assignment, a compound statement's own line."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return "call " + ast.unparse(stmt.value.func)
    if isinstance(stmt, ast.Assign):
        return "assign " + " ".join(ast.unparse(t) for t in stmt.targets)
    if isinstance(stmt, (ast.If, ast.While)):
        return f"{type(stmt).__name__} {ast.unparse(stmt.test)}"
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return "with " + ", ".join(ast.unparse(i.context_expr) for i in stmt.items)
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return f"for {ast.unparse(stmt.target)} in {ast.unparse(stmt.iter)}"
    return ast.unparse(stmt)


def check_claims(output: str, records: PlanRecords) -> None:
    """Issue 12, pattern 11: every "on rank 0", "rank 0 loads" and "scatter" entry of the report
    is checked against the produced code; one it does not bear out is an internal error
    (:class:`VerificationError`)."""
    if not records.claims:
        return
    tree = ast.parse(output)
    test = ast.dump(ast.parse(records.guard_test, mode="eval").body)
    guarded: set[str] = set()
    loads: set[str] = set()
    scattered: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.dump(node.test) == test:
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, ast.stmt):
                        guarded.add(_signature(sub))
            for other in node.orelse:
                if isinstance(other, ast.Assign) and isinstance(
                    other.value, (ast.Constant, ast.Tuple)
                ):
                    for target in other.targets:
                        loads.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "scatter_dataset":
                scattered.add(node.args[0].id)
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            size = node.args[0]
            if (
                name == "scatter_index"
                and isinstance(size, ast.Call)
                and size.args
                and isinstance(size.args[0], ast.Name)
            ):
                scattered.add(size.args[0].id)
    for claim in records.claims:
        if claim.kind == "guarded":
            original = ast.parse(textwrap.dedent(claim.subject)).body
            ok = bool(original) and _signature(original[0]) in guarded
        elif claim.kind == "rank0-loads":
            ok = claim.subject in loads
        else:
            ok = claim.subject in scattered
        if not ok:
            raise VerificationError(
                claim.line, f"the report says '{claim.message}', but the output does not show it"
            )
