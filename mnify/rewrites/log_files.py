"""Log files: rank 0 keeps the script's log file, the other ranks log to the console.

``logging.basicConfig(filename=path, ...)`` becomes ``filename=path if comm.rank == 0 else
None`` (``basicConfig`` without a file name logs to the console with the same format and
level), and a file handler construction (``FileHandler``, the rotating handlers) becomes
``FileHandler(path) if comm.rank == 0 else logging.StreamHandler()``, so the code that adds,
formats and levels the handler runs unchanged on every rank. Both are expression replacements
inside the statement; where the communicator does not exist yet (logging set up at import time,
before the arguments are parsed) the report asks a person.
"""

from __future__ import annotations

import libcst as cst

from mnify.hazards.mn403_log_file_on_every_rank import LOG_BASIC_CONFIG, LOG_FILE_HANDLERS
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.registry import rewrite
from mnify.syntax import mentions_rank

_STEP = "log-file"


def _logging_name(ctx: FileContext) -> str | None:
    return ctx.facts.local_name_of("logging")


@rewrite(_STEP, order=78, fixes=("MN403",), code="MN814")
def plan(ctx: FileContext) -> None:
    if not ctx.options.data_parallel:
        return
    for call in ctx.facts.calls:
        stmt = call.stmt
        handler = call.qname in LOG_FILE_HANDLERS
        basic = call.qname == LOG_BASIC_CONFIG
        if stmt is None or not (handler or basic):
            continue
        if id(stmt) in ctx.facts.under_rank_test or ctx.suppressed(call.node, _STEP):
            continue
        if mentions_rank(call.node):
            continue  # a log file per rank already
        filename = next(
            (a for a in call.node.args if a.keyword is not None and a.keyword.value == "filename"),
            None,
        )
        if basic and filename is None:
            continue
        if ctx.before_comm_exists(stmt) or ctx.plan.is_guarded(stmt):
            if not ctx.plan.is_guarded(stmt):
                ctx.note(
                    call.node,
                    _STEP,
                    "needs-person",
                    "every rank logs to this file, set up before the communicator exists: let "
                    "rank 0 keep the file (the others log to the console) once comm is created",
                )
            continue
        comm = ctx.comm_at(call.func, _STEP)
        if comm is None:
            ctx.note(call.node, _STEP, "needs-person", "every rank logs to this file")
            continue
        if basic:
            assert filename is not None
            value = f"{ctx.code(filename.value)} if {comm}.rank == 0 else None"
            ctx.plan.replace_node(filename, _arg_value(value), stmt)
            ctx.note(
                call.node,
                _STEP,
                "changed",
                "logging.basicConfig: rank 0 keeps the log file, the other ranks log to the "
                "console",
            )
            continue
        logging = _logging_name(ctx) or "logging"
        if _logging_name(ctx) is None:
            ctx.imports_needed.add("import logging")
        code = ctx.code(call.node)
        value = f"{code} if {comm}.rank == 0 else {logging}.StreamHandler()"
        ctx.plan.replace_node(call.node, _replaced_by(value), stmt)
        ctx.note(
            call.node,
            _STEP,
            "changed",
            f"{call.qname.rsplit('.', 1)[-1]}: rank 0 keeps the log file, the other ranks log to "
            "the console",
        )


def _arg_value(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Arg)
        return node.with_changes(value=expression(value))

    return fn


def _replaced_by(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        return expression(value)

    return fn
