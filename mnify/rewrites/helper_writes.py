"""Writes the entry point reaches through the project's own code, done on rank 0 where it calls
them (docs/design.md §1, step "rank-0 guards"; docs/converter.md MN806).

Two shapes public projects have that a guard inside the callee cannot fix (the callee cannot see
``comm``, and no rewrite changes a signature, docs/design.md §0):

* **A helper that writes and returns what it made**, often in another module of the tree:
  ``out = prepare_output_dir(args)`` creates the result directory, copies the sources there and
  writes the command line, then returns the directory. Every rank needs the value; only rank 0
  may make it. The call becomes ``out = comm.bcast_obj(prepare_output_dir(args) if comm.rank
  == 0 else None)``: rank 0 runs the helper, the others wait for it and get what it returned,
  so code after it on every rank finds what the helper made.
* **A method of the user's class that only writes** (``model.dump_summary(path)`` after
  training): its call statement is guarded, ``if comm.rank == 0:``. A method is found by name, so
  only a name that one class of the project defines (and that is not one of Chainer's or
  Python's usual method names) is guarded.

``subprocess`` (or ``os.system``) inside such a helper forks the MPI process on rank 0: it is
reported for a person (MN203) in the helper's own file, which lint does not read as a training
script.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites.context import FileContext, Lift
from mnify.rewrites.edits import Guard, NodeFn, expression


def guardable_method(name: str) -> bool:
    """Whether a writing method may be guarded at its calls by its name."""
    return name not in vocab.COMMON_METHOD_NAMES and not name.startswith("__")


def method_definitions(contexts: Iterable[FileContext]) -> Counter[str]:
    """How many classes of the project define each method name."""
    found: Counter[str] = Counter()
    for ctx in contexts:
        for cls in ctx.facts.classes.values():
            body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
            found.update(s.name.value for s in body if isinstance(s, cst.FunctionDef))
    return found


def report_fork_hazards(ctx: FileContext, helper: cst.FunctionDef, label: str) -> None:
    """``subprocess`` in a helper rank 0 now runs: a fork of the MPI process, for a person. Only
    in files without a training entry point (in one, lint's MN203 reports it already)."""
    if ctx.entry is not None:
        return
    for call in ctx.facts.calls:
        if ctx.outermost_scope(call.func) is not helper:
            continue
        if call.qname.lstrip(".") in vocab.SUBPROCESS_CALLS:
            ctx.note(
                call.node,
                "fork-hazard",
                "needs-person",
                f"{call.qname.lstrip('.')} in {helper.name.value}(), which {label} on rank 0: "
                "starting a process forks the MPI process (Open MPI can abort or hang); do it "
                "before the job starts, or with shutil / pathlib in Python",
                "MN203",
            )


def _assigned_from(stmt: cst.BaseStatement | None, node: cst.Call) -> bool:
    """``name = helper(...)`` (one target, the call its whole value)."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Assign)
        and stmt.body[0].value is node
    )


def broadcast_from_rank0(ctx: FileContext, comm: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        code = ctx.code(node)
        return expression(f"{comm}.bcast_obj({code} if {comm}.rank == 0 else None)")

    return fn


def broadcast_result(ctx: FileContext, call: CallFact, lift: Lift) -> bool:
    """``out = helper(...)`` -> rank 0 runs it, every rank gets its result; False when the call
    is not of that shape (the caller says what a person must do)."""
    stmt = call.stmt
    if stmt is None or not _assigned_from(stmt, call.node):
        return False
    if ctx.on_rank0_already(stmt) or ctx.plan.is_guarded(stmt) or ctx.before_comm_exists(stmt):
        return True
    if ctx.suppressed(stmt, "rank0-guard", "MN402"):
        return True
    if ctx.reaches_collective(stmt) is not None:
        return False
    parent = call.parent_qname
    if parent.endswith("bcast_obj") or id(call.node) in ctx.plan.replace:
        return True  # converted before, or broadcast already by the guards (its effects)
    comm = ctx.comm_at(call.func, lift.label)
    if comm is None:
        return True
    ctx.plan.replace_node(call.node, broadcast_from_rank0(ctx, comm), stmt)
    ctx.note(
        stmt,
        "rank0-guard",
        "changed",
        f"{lift.name}() writes ({lift.label}) and returns what it made: rank 0 runs it, the "
        f"other ranks wait for it and get its result ({comm}.bcast_obj)",
        "MN402",
    )
    return True


def guard_method_calls(ctx: FileContext, lifts: list[Lift], definitions: Mapping[str, int]) -> None:
    """``obj.method(...)`` alone on its line, for a writing method only one class defines."""
    methods = {
        lift.name: lift
        for lift in lifts
        if lift.kind == "rank0-method" and definitions.get(lift.name, 0) == 1
    }
    if not methods:
        return
    for call in ctx.facts.calls:
        lift = methods.get(call.method or "")
        stmt = call.stmt
        func = call.node.func
        if lift is None or stmt is None or not isinstance(func, cst.Attribute):
            continue
        if isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
            continue  # the class calling itself: its caller is what gets guarded
        if not ctx.visible(call.func):
            continue
        if not (
            isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and stmt.body[0].value is call.node
        ):
            continue
        if ctx.on_rank0_already(stmt) or ctx.plan.is_guarded(stmt) or ctx.before_comm_exists(stmt):
            continue
        if ctx.suppressed(stmt, "rank0-guard", "MN402") or ctx.reaches_collective(stmt):
            continue
        if ctx.comm_at(call.func, lift.label) is None:
            continue
        ctx.plan.guard_stmt(stmt, Guard("rank0"))
        ctx.note(
            stmt,
            "rank0-guard",
            "changed",
            f"{lift.name}() is a method that writes ({lift.label}): rank 0 only",
            "MN402",
            claim=("guarded", stmt),
        )
