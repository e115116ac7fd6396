"""docs/design.md §1, step "shared files": a file rank 0 writes is read after it is written.

The rank-0 guards leave one writer of each file. Every rank still reads what the script reads
back: the best model a ``snapshot_object`` saved during training, reloaded for the test
(``load_npz(os.path.join(args.out, 'best_model.npz'), model)`` right after ``trainer.run()``), a
vocabulary written and read again. The other ranks get there while rank 0 may still be
writing (its last snapshot runs after the last update), and read nothing, an old file or half a
file. So before the first statement that reads a file rank 0 writes earlier in the same
function, every rank waits at ``comm.barrier()``. A read matches a write when their paths share
a string (``'best_model.npz'``) or are the same variable (``vocab_path``, also through the one
assignment that names it). One barrier serves the reads that follow it until rank 0 writes
again; a barrier already there (a converted script) is kept and none is added. A read inside a
loop is left (a barrier there would run once per iteration) and reported for a person.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import statement
from mnify.rewrites.registry import rewrite
from mnify.syntax import argument_node

_STEP = "shared-files"
# Writers whose first argument is the path.
_PATH_FIRST_WRITERS = vocab.FILE_WRITERS - vocab.WRITERS_THROUGH_A_FILE
_SNAPSHOTS = ("snapshot_object", "snapshot")
_LOOPS = (cst.For, cst.While)


def _path(call: CallFact, position: int, keyword: str) -> cst.BaseExpression | None:
    arg = argument_node(call.node, position, keyword)
    return arg.value if arg is not None else None


def _is_open(call: CallFact) -> bool:
    return call.qname.lstrip(".") in ("open", *vocab.OPEN_FUNCTIONS)


def _opens_for_writing(call: CallFact) -> bool:
    mode = argument_node(call.node, 1, "mode")
    if mode is None or not isinstance(mode.value, cst.SimpleString):
        return False
    return any(flag in str(mode.value.evaluated_value) for flag in vocab.WRITE_MODES)


def _tokens(ctx: FileContext, expr: cst.BaseExpression | None, func: object) -> set[str]:
    """What names a path: its string constants (and their last component), and the
    variable or attribute it is, followed through the variable's one assignment in ``func``."""
    if expr is None:
        return set()
    found: set[str] = set()
    if isinstance(expr, (cst.Name, cst.Attribute)):
        found.add(ctx.code(expr).strip())
        if isinstance(expr, cst.Name):
            assigned = [a for a in ctx.facts.assigns_of(expr.value) if a.func is func]
            if len(assigned) == 1 and assigned[0].value is not None:
                found |= _constants(assigned[0].value)
    return found | _constants(expr)


def _constants(expr: cst.BaseExpression) -> set[str]:
    found: set[str] = set()

    class _Strings(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            text = str(node.evaluated_value)
            if text and "{" not in text and text not in (".", "/"):
                found.add(text.rstrip("/").rsplit("/", 1)[-1])

    expr.visit(_Strings())
    return found


def _written(ctx: FileContext, call: CallFact) -> set[str]:
    """The path tokens of a file ``call`` writes, when it writes one."""
    bare = call.qname.lstrip(".")
    if _is_open(call) and _opens_for_writing(call):
        return _tokens(ctx, _path(call, 0, "file"), call.func)
    if bare in _PATH_FIRST_WRITERS or vocab.is_serializer_save(bare):
        return _tokens(ctx, _path(call, 0, "file"), call.func)
    if vocab.is_extension(bare, *_SNAPSHOTS):
        position = 1 if vocab.last(bare) == "snapshot_object" else 99
        return _tokens(ctx, _path(call, position, "filename"), call.func)
    return set()


def _read(ctx: FileContext, call: CallFact) -> set[str]:
    """The path tokens of a file ``call`` reads, when it reads one."""
    bare = call.qname.lstrip(".")
    if (_is_open(call) and not _opens_for_writing(call)) or bare in vocab.FILE_READERS:
        return _tokens(ctx, _path(call, 0, "file"), call.func)
    return set()


def _on_rank0(ctx: FileContext, stmt: cst.BaseStatement) -> bool:
    """Run by rank 0 alone: under a rank check in the input or a guard the plan adds."""
    return ctx.on_rank0_already(stmt) or ctx.under_rank0_guard(stmt)


def _anchor(ctx: FileContext, stmt: cst.BaseStatement) -> cst.BaseStatement | None:
    """The statement of the function's own body that holds ``stmt`` (the barrier goes before
    it, so a test such as ``if os.path.exists(path):`` waits too); None inside a loop."""
    current = stmt
    while True:
        if isinstance(current, _LOOPS):
            return None
        parent = ctx.facts.parent_statement(current)
        if parent is None or isinstance(parent, (cst.FunctionDef, cst.ClassDef)):
            return current
        current = parent


def _is_barrier(call: CallFact) -> bool:
    return call.method == "barrier"


@rewrite(_STEP, order=85, code="MN820")
def plan(ctx: FileContext) -> None:
    if not ctx.options.data_parallel:
        return
    by_function: dict[int, list[CallFact]] = {}
    for call in ctx.facts.calls:
        if call.stmt is not None:
            by_function.setdefault(id(call.func), []).append(call)
    for calls in by_function.values():
        _plan_function(ctx, sorted(calls, key=lambda c: ctx.line(c.node)))


def _plan_function(ctx: FileContext, calls: list[CallFact]) -> None:
    pending: dict[str, CallFact] = {}  # path token -> the rank-0 write not yet waited for
    for call in calls:
        stmt = call.stmt
        assert stmt is not None
        if _is_barrier(call) and not _on_rank0(ctx, stmt):
            pending.clear()
            continue
        written = _written(ctx, call)
        if written and _on_rank0(ctx, stmt):
            pending.update(dict.fromkeys(written, call))
            continue
        shared = sorted(_read(ctx, call) & set(pending))
        if not shared or _on_rank0(ctx, stmt) or ctx.suppressed(stmt, _STEP):
            continue
        writer = pending[shared[0]]
        what = f"{ctx.called_by(call)}() reads {shared[0]!r} that rank 0 writes at line " + str(
            ctx.line(writer.node)
        )
        anchor = _anchor(ctx, stmt)
        comm = ctx.comm_at(call.func, "a file read after rank 0 writes it")
        if anchor is None or comm is None:
            ctx.note(
                call.node,
                _STEP,
                "needs-person",
                f"{what}; "
                + (
                    "it is read inside a loop"
                    if anchor is None
                    else "the communicator is not visible here"
                )
                + ": make every rank wait for the write (comm.barrier()) before reading it",
            )
            pending.clear()
            continue
        ctx.plan.insert_before(anchor, [statement(f"{comm}.barrier()\n")])
        ctx.note(
            anchor,
            _STEP,
            "changed",
            f"{what}: every rank waits at {comm}.barrier() before reading it",
        )
        pending.clear()
