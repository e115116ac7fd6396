"""The plan and the report's claims as the output check reads them (``verify``).

The check shares no code with the applier and sees no libcst node: this module turns the edit
plan into lines, kinds and code, and each claim into the code or the name it is about.
"""

from __future__ import annotations

import libcst as cst

from mnify.rewrites.context import FileContext
from mnify.rewrites.report import Claim
from mnify.rewrites.verify import ClaimRecord, PlanRecords, kind_name


def _statement_key(ctx: FileContext, node: cst.CSTNode) -> tuple[int, str]:
    """The (line, kind) by which the output check knows an original statement."""
    first = node.body[0] if isinstance(node, cst.SimpleStatementLine) and node.body else node
    return ctx.line(node), kind_name(type(first).__name__)


def plan_records(ctx: FileContext) -> PlanRecords:
    """The plan as the output check reads it: lines, kinds and code, no nodes."""
    plan = ctx.plan
    records = PlanRecords(guard_test=f"{plan.comm}.rank == 0")
    for key, guard in plan.guard.items():
        records.guarded[_statement_key(ctx, plan.nodes[key])] = guard.else_names
    for within in plan.replaced_within.values():
        if within is not None:
            records.replaced.add(_statement_key(ctx, within))
    empty = cst.Module(body=[])
    for inserted in (*plan.before.values(), *plan.after.values()):
        records.inserted.extend(empty.code_for_node(stmt) for stmt in inserted)
    records.claims.extend(
        _claim_record(ctx, entry.line, entry.message, claim) for entry, claim in ctx.report.claims
    )
    return records


def _claim_record(ctx: FileContext, line: int, message: str, claim: Claim) -> ClaimRecord:
    """A claim with its subject as text: a guarded statement's code, or a dataset's name."""
    kind, subject = claim
    if kind == "guarded":
        assert isinstance(subject, cst.CSTNode)
        return ClaimRecord(line, message, kind, ctx.code(subject))
    # a name, never empty: a node here (no rewrite files one) matches nothing, as before
    return ClaimRecord(line, message, kind, subject if isinstance(subject, str) else "")
