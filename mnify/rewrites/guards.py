"""DESIGN.md section 1, step "rank-0 guards": only rank 0 writes logs, snapshots and prints.

``trainer.extend(extensions.LogReport())`` and the other writing/reporting extensions
(PrintReport, ProgressBar, PlotReport, snapshot, snapshot_object, dump_graph/DumpGraph,
VariableStatisticsPlot), informational ``print``s and ``serializers.save_*`` calls go under
``if comm.rank == 0:``; neighbours share one ``if``. An ``if`` whose whole body is such
statements (``if extensions.PlotReport.available(): ...``) is guarded as a whole. Extensions
that change training state (ExponentialShift, LinearShift, observe_lr, evaluators) stay on all
ranks. Prints in helper functions that cannot see the communicator are left alone.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import Guard
from mnify.rewrites.facts import CallFact, mentions_rank
from mnify.rewrites.registry import rewrite

RANK0 = Guard("rank0")


def _code_of(what: str) -> str:
    """The lint rule a writer falls under: prints MN902, saves MN402, extensions MN401."""
    if what == "print":
        return "MN902"
    if what.startswith("save_"):
        return "MN402"
    return "MN401"


# writers whose file holds model parameters: incomplete under model parallel on rank 0 alone
_MODEL_SAVERS = frozenset({"snapshot", "snapshot_object", "save_npz", "save_hdf5"})


def _writer_name(ctx: FileContext, call: CallFact) -> str | None:
    """What this call writes, when it is a statement only rank 0 should run."""
    if call.qname in ("print", "builtins.print"):
        # a print that names the rank is meant for every rank ("rank 3 ready")
        return None if mentions_rank(call.node) else "print"
    if vocab.is_serializer_save(call.qname):
        return vocab.last(call.qname)
    if call.method == "extend" and call.node.args:
        ext = call.node.args[0].value
        fact = ctx.facts.call_of(ext)
        if fact is not None and vocab.is_extension(fact.qname, *vocab.REPORTING_EXTENSION_NAMES):
            return vocab.last(fact.qname)
        if isinstance(ext, cst.Name):
            for a in ctx.facts.assigns_of(ext.value):
                made = ctx.facts.call_of(a.value)
                if made is not None and vocab.is_extension(
                    made.qname, *vocab.REPORTING_EXTENSION_NAMES
                ):
                    return vocab.last(made.qname)
    return None


def _guardable(ctx: FileContext, stmt: cst.BaseStatement) -> list[str] | None:
    """The writers in a statement made only of writer calls, else None."""
    if isinstance(stmt, cst.SimpleStatementLine):
        calls = {id(c.node): c for c in ctx.facts.calls_by_stmt.get(id(stmt), [])}
        found: list[str] = []
        for small in stmt.body:
            if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
                return None
            fact = calls.get(id(small.value))
            what = _writer_name(ctx, fact) if fact is not None else None
            if what is None:
                return None
            found.append(what)
        return found
    if isinstance(stmt, cst.If) and isinstance(stmt.body, cst.IndentedBlock):
        found = []
        bodies = [stmt.body]
        if isinstance(stmt.orelse, cst.Else) and isinstance(stmt.orelse.body, cst.IndentedBlock):
            bodies.append(stmt.orelse.body)
        elif stmt.orelse is not None:
            return None
        for body in bodies:
            for inner in body.body:
                got = _guardable(ctx, inner)
                if got is None:
                    return None
                found.extend(got)
        return found
    return None


@rewrite("rank0-guard", order=80, fixes=("MN401", "MN402", "MN902"), code="MN806")
def plan(ctx: FileContext) -> None:
    seen: set[int] = set()
    for call in ctx.facts.calls:
        stmt = call.stmt
        if stmt is None or id(stmt) in seen or id(stmt) in ctx.facts.under_rank0:
            continue
        what = _writer_name(ctx, call)
        if what is None:
            continue
        seen.add(id(stmt))
        if _guardable(ctx, stmt) is None:
            continue
        code = _code_of(what)
        # Lift the guard to an enclosing `if` made only of writers.
        target = stmt
        while True:
            block = ctx.facts.block_of.get(id(target))
            owner = ctx.facts.block_owner_stmt.get(id(block.owner)) if block else None
            if (
                isinstance(owner, cst.If)
                and id(owner) not in ctx.facts.under_rank0
                and _guardable(ctx, owner) is not None
            ):
                target = owner
                seen.add(id(owner))
                continue
            break
        if what == "print" and not ctx.visible(call.func):
            continue
        codes = {_code_of(w) for w in _guardable(ctx, target) or [what]}
        only = ctx.options.only_codes
        if only is not None and not codes <= only:
            continue
        if ctx.plan.is_guarded(target) or any(
            ctx.suppressed(target, "rank0-guard", c) for c in codes
        ):
            continue
        reached = ctx.reaches_collective(target)
        if reached is not None:
            ctx.note(
                target,
                "rank0-guard",
                "needs-person",
                f"{what} stays on every rank: it calls {reached}(), which now reaches a "
                "collective that every rank must join",
                code,
            )
            continue
        comm = ctx.comm_at(call.func, what)
        if comm is None:
            ctx.note(
                target,
                "rank0-guard",
                "needs-person",
                f"{what} runs on every rank here and the communicator cannot reach it: "
                "run it on rank 0 only",
                code,
            )
            continue
        ctx.plan.guard_stmt(target, RANK0)
        ctx.note(target, "rank0-guard", "changed", f"{what} on rank 0 only", code)
        if not ctx.options.data_parallel and what in _MODEL_SAVERS:
            ctx.note(
                target,
                "rank0-guard",
                "needs-person",
                f"model parallel: rank 0's {what} holds only rank 0's slices of the split layers; "
                "have every rank save its own file (a per-rank name, e.g. with comm.rank in it) "
                "or use mn.create_multi_node_checkpointer",
            )
