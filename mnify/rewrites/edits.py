"""The edit plan all rewrites write into, and the one transformer that applies it.

Rewrites never transform the tree themselves: they record edits keyed by the *original* nodes
they found in the facts walk (replace an expression, insert statements before/after a statement,
put a statement under ``if comm.rank == 0:``). One ``ApplyEdits`` pass then rebuilds only the
edited nodes, so everything outside them keeps its comments and formatting byte for byte.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst

NodeFn = Callable[[cst.CSTNode], cst.CSTNode]


@functools.lru_cache(maxsize=4096)
def statement(code: str) -> cst.BaseStatement:
    """``cst.parse_statement`` memoised: nodes are immutable, so one parse serves every file."""
    return cst.parse_statement(code)


@functools.lru_cache(maxsize=4096)
def expression(code: str) -> cst.BaseExpression:
    """``cst.parse_expression`` memoised (see :func:`statement`)."""
    return cst.parse_expression(code)


@dataclass(frozen=True)
class Guard:
    """Put a statement under ``if <comm>.rank == 0:``; same-key neighbours share one ``if``.

    ``else_names`` adds ``else: a, b = None, None`` (rank-0 data loading).
    """

    key: str
    else_names: tuple[str, ...] = ()


@dataclass
class EditPlan:
    """Edits keyed by ``id()`` of *original* nodes; ``nodes`` keeps each keyed node alive, so an
    id can never be reused by another node while the plan exists."""

    comm: str = "comm"
    replace: dict[int, list[NodeFn]] = field(default_factory=dict)
    before: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    guard: dict[int, Guard] = field(default_factory=dict)
    # statements holding an edit (None: somewhere unknown, so nothing may be skipped)
    dirty: list[cst.BaseStatement | None] = field(default_factory=list)
    # the original node behind every key above, and the statement holding each replacement
    nodes: dict[int, cst.CSTNode] = field(default_factory=dict)
    replaced_within: dict[int, cst.BaseStatement | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.replace or self.before or self.after or self.guard)

    def _own(self, node: cst.CSTNode) -> int:
        self.nodes[id(node)] = node
        return id(node)

    def replace_node(self, node: cst.CSTNode, fn: NodeFn, within: cst.BaseStatement | None) -> None:
        """Replace ``node`` (inside statement ``within``) by ``fn(updated node)``."""
        key = self._own(node)
        self.dirty.append(within)
        self.replaced_within[key] = within
        self.replace.setdefault(key, []).append(fn)

    def insert_before(
        self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement], *, first: bool = False
    ) -> None:
        key = self._own(stmt)
        self.dirty.append(stmt)
        current = self.before.setdefault(key, [])
        current[:] = [*new, *current] if first else [*current, *new]

    def insert_after(
        self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement], *, first: bool = False
    ) -> None:
        """Insert after ``stmt``; ``first`` puts ``new`` ahead of earlier insertions (imports)."""
        key = self._own(stmt)
        self.dirty.append(stmt)
        current = self.after.setdefault(key, [])
        current[:] = [*new, *current] if first else [*current, *new]

    def guard_stmt(self, stmt: cst.BaseStatement, guard: Guard) -> bool:
        """Guard ``stmt`` unless another rewrite already did; returns whether it was added."""
        if id(stmt) in self.guard:
            return False
        key = self._own(stmt)
        self.dirty.append(stmt)
        self.guard[key] = guard
        return True

    def unguard(self, stmt: cst.BaseStatement) -> None:
        """Drop a guard planned earlier (another rewrite decides the statement's guard)."""
        self.guard.pop(id(stmt), None)

    def is_guarded(self, stmt: cst.BaseStatement) -> bool:
        return id(stmt) in self.guard

    def else_names(self, run: Sequence[cst.BaseStatement]) -> tuple[str, ...]:
        """The names a run of guarded statements binds on rank 0 only, in order, once each."""
        names: dict[str, None] = {}
        for stmt in run:
            names.update(dict.fromkeys(self.guard[id(stmt)].else_names))
        return tuple(names)

    def guard_runs(self, body: Sequence[cst.BaseStatement]) -> list[list[int]]:
        """Which guarded statements of one original block share an ``if``: runs of neighbours
        (indices into ``body``) with the same guard key and nothing inserted between them.
        Decided from the original siblings alone. The run's ``else`` binds None to every name
        its statements bind on rank 0 only (:meth:`else_names`)."""
        runs: list[list[int]] = []
        for i, stmt in enumerate(body):
            guard = self.guard.get(id(stmt))
            if guard is None:
                continue
            if runs and runs[-1][-1] == i - 1:
                prev = body[i - 1]
                prev_guard = self.guard[id(prev)]
                if (
                    prev_guard.key == guard.key
                    and not self.after.get(id(prev))
                    and not self.before.get(id(stmt))
                ):
                    runs[-1].append(i)
                    continue
            runs.append([i])
        return runs


def _leading(stmt: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    """Blank lines and comments above a statement (every concrete statement has them)."""
    return getattr(stmt, "leading_lines", ())


def rank0_test(comm: str) -> cst.BaseExpression:
    return expression(f"{comm}.rank == 0")


def guard_else(names: Sequence[str]) -> cst.BaseStatement:
    """``a, b = None, None``: what the ranks that skip a loading guard bind instead."""
    return statement(f"{', '.join(names)} = {', '.join('None' for _ in names)}\n")


class ApplyEdits(cst.CSTTransformer):
    """Applies an :class:`EditPlan` in one pass.

    Statements only get their expression replacements; insertions and guards are made where a
    block is left, from the *original* block's statements (zipped with the updated ones, which
    correspond one to one because no statement is ever removed or split on the way up). So the
    applier never has to recognise a node it built itself.

    ``parent_of`` maps a statement to the statement enclosing it; with it the pass skips every
    statement that holds no edit (a transformer otherwise rebuilds the whole tree).
    """

    def __init__(
        self,
        plan: EditPlan,
        parent_of: Callable[[cst.BaseStatement], cst.BaseStatement | None] | None = None,
    ) -> None:
        super().__init__()
        self.plan = plan
        self._open: set[int] | None = None
        if parent_of is not None and None not in plan.dirty:
            self._open = set()
            for stmt in plan.dirty:
                while stmt is not None and id(stmt) not in self._open:
                    self._open.add(id(stmt))
                    stmt = parent_of(stmt)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None  # no per-attribute hooks: skip their dispatch

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if (
            self._open is not None
            and isinstance(node, cst.BaseStatement)
            and id(node) not in self._open
        ):
            return False  # nothing to change in here: keep the original subtree
        return super().on_visit(node)

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        node = super().on_leave(original_node, updated_node)
        for fn in self.plan.replace.get(id(original_node), ()):
            assert isinstance(node, cst.CSTNode)
            node = fn(node)
        return node

    def _block(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> list[cst.BaseStatement]:
        """The new statement list of one block: insertions, and guards by planned runs."""
        plan = self.plan
        if len(original) != len(updated) or not any(
            id(s) in plan.before or id(s) in plan.after or id(s) in plan.guard for s in original
        ):
            return list(updated)
        run_of = {run[0]: run for run in plan.guard_runs(original)}
        out: list[cst.BaseStatement] = []
        i = 0
        while i < len(original):
            run = run_of.get(i, [i])
            first, last = original[run[0]], original[run[-1]]
            before = plan.before.get(id(first), [])
            after = plan.after.get(id(last), [])
            guard = plan.guard.get(id(first))
            if guard is None:
                node = updated[i]
                if before:
                    # Comments above the original statement stay above what is inserted before it.
                    lead = _leading(node)
                    node = node.with_changes(leading_lines=())
                    first = before[0].with_changes(leading_lines=(*lead, *_leading(before[0])))
                    before = [first, *before[1:]]
                out.extend([*before, node, *after])
            else:
                inner = [updated[j] for j in run]
                lead = _leading(inner[0])
                inner[0] = inner[0].with_changes(leading_lines=())
                names = plan.else_names([original[j] for j in run])
                orelse = None
                if names:
                    body = cst.IndentedBlock([guard_else(names)])
                    orelse = cst.Else(body=body)
                made = cst.If(
                    test=rank0_test(plan.comm),
                    body=cst.IndentedBlock(inner),
                    orelse=orelse,
                    leading_lines=lead,
                )
                out.extend([*before, made, *after])
            i = run[-1] + 1
        return out

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = self._block(original_node.body, updated_node.body)
        return updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._block(original_node.body, updated_node.body))
