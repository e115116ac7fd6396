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
    """Edits keyed by ``id()`` of original nodes (the nodes are kept alive in ``_keep``)."""

    comm: str = "comm"
    replace: dict[int, list[NodeFn]] = field(default_factory=dict)
    before: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    guard: dict[int, Guard] = field(default_factory=dict)
    # statements holding an edit (None: somewhere unknown, so nothing may be skipped)
    dirty: list[cst.BaseStatement | None] = field(default_factory=list)
    _keep: list[cst.CSTNode] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.replace or self.before or self.after or self.guard)

    def replace_node(self, node: cst.CSTNode, fn: NodeFn, within: cst.BaseStatement | None) -> None:
        """Replace ``node`` (inside statement ``within``) by ``fn(updated node)``."""
        self._keep.append(node)
        self.dirty.append(within)
        self.replace.setdefault(id(node), []).append(fn)

    def insert_before(
        self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement], *, first: bool = False
    ) -> None:
        self._keep.append(stmt)
        self.dirty.append(stmt)
        current = self.before.setdefault(id(stmt), [])
        current[:] = [*new, *current] if first else [*current, *new]

    def insert_after(
        self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement], *, first: bool = False
    ) -> None:
        """Insert after ``stmt``; ``first`` puts ``new`` ahead of earlier insertions (imports)."""
        self._keep.append(stmt)
        self.dirty.append(stmt)
        current = self.after.setdefault(id(stmt), [])
        current[:] = [*new, *current] if first else [*current, *new]

    def guard_stmt(self, stmt: cst.BaseStatement, guard: Guard) -> bool:
        """Guard ``stmt`` unless another rewrite already did; returns whether it was added."""
        if id(stmt) in self.guard:
            return False
        self._keep.append(stmt)
        self.dirty.append(stmt)
        self.guard[id(stmt)] = guard
        return True

    def is_guarded(self, stmt: cst.BaseStatement) -> bool:
        return id(stmt) in self.guard


def _leading(stmt: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    """Blank lines and comments above a statement (every concrete statement has them)."""
    return getattr(stmt, "leading_lines", ())


def rank0_test(comm: str) -> cst.BaseExpression:
    return expression(f"{comm}.rank == 0")


class ApplyEdits(cst.CSTTransformer):
    """Applies an :class:`EditPlan` in one pass.

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
        self._made: dict[int, Guard] = {}
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
        key = id(original_node)
        for fn in self.plan.replace.get(key, ()):
            assert isinstance(node, cst.CSTNode)
            node = fn(node)
        if not isinstance(original_node, cst.BaseStatement):
            return node
        guard = self.plan.guard.get(key)
        before = self.plan.before.get(key, [])
        after = self.plan.after.get(key, [])
        if guard is None and not before and not after:
            return node
        assert isinstance(node, cst.BaseStatement)
        if guard is not None:
            node = self._guarded(node, guard)
        if before and not guard:
            # Comments above the original statement stay above the block inserted before it.
            lead = _leading(node)
            node = node.with_changes(leading_lines=())
            before = [before[0].with_changes(leading_lines=lead), *before[1:]]
        return cst.FlattenSentinel([*before, node, *after])

    def _guarded(self, stmt: cst.BaseStatement, guard: Guard) -> cst.If:
        orelse = None
        if guard.else_names:
            names = ", ".join(guard.else_names)
            nones = ", ".join("None" for _ in guard.else_names)
            orelse = cst.Else(body=cst.IndentedBlock([statement(f"{names} = {nones}\n")]))
        made = cst.If(
            test=rank0_test(self.plan.comm),
            body=cst.IndentedBlock([stmt.with_changes(leading_lines=())]),
            orelse=orelse,
            leading_lines=_leading(stmt),
        )
        self._made[id(made)] = guard
        return made

    def _merge(self, body: tuple[cst.BaseStatement, ...]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for stmt in body:
            prev = out[-1] if out else None
            g_prev = self._made.get(id(prev)) if prev is not None else None
            g_this = self._made.get(id(stmt))
            if (
                prev is not None
                and g_prev is not None
                and g_this is not None
                and g_prev.key == g_this.key
                and isinstance(prev, cst.If)
                and isinstance(stmt, cst.If)
                and prev.orelse is None
            ):
                assert isinstance(prev.body, cst.IndentedBlock)
                assert isinstance(stmt.body, cst.IndentedBlock)
                inner = list(stmt.body.body)
                inner[0] = inner[0].with_changes(leading_lines=stmt.leading_lines)
                merged = prev.with_changes(
                    body=prev.body.with_changes(body=[*prev.body.body, *inner]),
                    orelse=stmt.orelse,
                )
                self._made[id(merged)] = g_prev
                out[-1] = merged
            else:
                out.append(stmt)
        return out

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        if not self._made:
            return updated_node
        return updated_node.with_changes(body=self._merge(tuple(updated_node.body)))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._made:
            return updated_node
        return updated_node.with_changes(body=self._merge(tuple(updated_node.body)))
