"""MN403 ``log-file-on-every-rank``: every rank logs to the same file.

Its documentation (docs/rules.md, ``mnify explain MN403``) is generated from the rule class below.
The fix is here too: :func:`fix`, the converter step ``log-file`` (MN814, docs/converter.md).
Fixture: fixtures/lint/MN403.py.

Family: MN4xx: output (report extensions, saved files, prints) belongs on one rank.
"""

from __future__ import annotations

import libcst as cst

from mnify.lint.rule import AppliesTo, Rule
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.registry import rewrite
from mnify.syntax import argument, mentions_rank

# logging's file handlers (the rotating ones live in logging.handlers)
LOG_FILE_HANDLERS = frozenset(
    {
        "logging.FileHandler",
        "logging.handlers.RotatingFileHandler",
        "logging.handlers.TimedRotatingFileHandler",
        "logging.handlers.WatchedFileHandler",
    }
)


LOG_BASIC_CONFIG = "logging.basicConfig"


def log_file_call(names: frozenset[str], node: cst.Call) -> bool:
    """``logging.basicConfig(filename=...)`` or the construction of a logging file handler."""
    if names & LOG_FILE_HANDLERS:
        return True
    if LOG_BASIC_CONFIG in names:
        return any(a.keyword is not None and a.keyword.value == "filename" for a in node.args)
    return False


class LogFileOnEveryRank(Rule):
    """Fires, in a distributed script, on ``logging.basicConfig(filename=...)`` and on the
    construction of a logging file handler (``FileHandler``, ``RotatingFileHandler``,
    ``TimedRotatingFileHandler``, ``WatchedFileHandler``) that runs on every rank (not inside a
    rank-conditional ``if``) with a path that does not mention a rank."""

    code = "MN403"
    name = "log-file-on-every-rank"
    summary = "every rank logs to the same file"
    why = (
        "Each rank opens the log file for appending: N processes write one file, their lines "
        "interleave and a rotating handler rotates it N times. Let rank 0 keep the file and the "
        "other ranks log to the console."
    )
    bad = (
        "import logging\n"
        "comm = chainermn.create_communicator()\n"
        "logging.basicConfig(filename='train.log', level=logging.INFO)\n"
    )
    good = (
        "import logging\n"
        "comm = chainermn.create_communicator()\n"
        "logging.basicConfig(\n"
        "    filename='train.log' if comm.rank == 0 else None, level=logging.INFO\n"
        ")\n"
    )
    fixable = True
    applies_to = AppliesTo.DISTRIBUTED

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.on_some_ranks() or not log_file_call(ctx.callee_names(node), node):
            return
        path = argument(node, 0, "filename")
        if path is not None and ctx.find_rank(path, ("global", "intra", "inter")):
            return
        self.report(node)


# ------------------------------------------------------------------------------------ fix
FIX_DOC = """Log files: rank 0 keeps the script's log file, the other ranks log to the console.

``logging.basicConfig(filename=path, ...)`` becomes ``filename=path if comm.rank == 0 else
None`` (``basicConfig`` without a file name logs to the console with the same format and
level), and a file handler construction (``FileHandler``, the rotating handlers) becomes
``FileHandler(path) if comm.rank == 0 else logging.StreamHandler()``, so the code that adds,
formats and levels the handler runs unchanged on every rank. Both are expression replacements
inside the statement; where the communicator does not exist yet (logging set up at import time,
before the arguments are parsed) the report asks a person.
"""


_STEP = "log-file"


def _logging_name(ctx: FileContext) -> str | None:
    return ctx.facts.local_name_of("logging")


@rewrite(_STEP, order=78, fixes=("MN403",), code="MN814", doc=FIX_DOC)
def fix(ctx: FileContext) -> None:
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
