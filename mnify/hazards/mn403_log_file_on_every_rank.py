"""MN403 ``log-file-on-every-rank``: every rank logs to the same file.

Its documentation (docs/rules.md, ``mnify explain MN403``) is generated from the rule class below.
The fix is here too: :func:`fix`, the converter step ``log-file`` (MN814, docs/converter.md).
Fixture: fixtures/lint/MN403.py.

Family: MN4xx: output (report extensions, saved files, prints) belongs on one rank.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.hazards.rule import AppliesTo, Rule
from mnify.program.facts import CallFact
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
    """``logging.basicConfig(filename=...)``, the construction of a logging file handler, or
    ``logging.config.dictConfig`` of a literal configuration naming a file handler class."""
    if names & LOG_FILE_HANDLERS:
        return True
    if LOG_BASIC_CONFIG in names:
        return any(a.keyword is not None and a.keyword.value == "filename" for a in node.args)
    if LOG_DICT_CONFIG in names and node.args:
        return _names_a_file_handler(node.args[0].value)
    return False


def _names_a_file_handler(config: cst.BaseExpression) -> bool:
    """Whether a configuration written in the call names a file handler class ("class":
    "logging.FileHandler"). A configuration built elsewhere or loaded from a file is not read:
    the rule stays silent rather than guess (the converter's fix handles both at run time)."""
    if isinstance(config, cst.Call):
        return False  # mn.rank0_log_files(config, comm), json.load(f), ...: not a literal here
    found = False

    class _Strings(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            nonlocal found
            found = found or node.evaluated_value in LOG_FILE_HANDLERS

    config.visit(_Strings())
    return found


class LogFileOnEveryRank(Rule):
    """Fires, in a distributed script, on ``logging.basicConfig(filename=...)``, on the
    construction of a logging file handler (``FileHandler``, ``RotatingFileHandler``,
    ``TimedRotatingFileHandler``, ``WatchedFileHandler``) and on ``logging.config.dictConfig``
    of a configuration written in the call that names one of those classes, when it runs on
    every rank (not inside a rank-conditional ``if``) with a path that does not mention a rank.
    A ``dictConfig`` of a configuration loaded from a file is not read."""

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

``logging.config.dictConfig(config)`` gets its configuration through
``mn.rank0_log_files(config, comm)`` (``mnify.runtime.log_config``): rank 0 keeps it as written,
the other ranks get each file handler as a console handler with the same level, formatter and
filters. The configuration may be a literal, a name or loaded from YAML or JSON: the file
handlers are found at run time. ChainerMN has no such helper: under ``--target chainermn`` the
report asks a person.
"""


_STEP = "log-file"
LOG_DICT_CONFIG = "logging.config.dictConfig"
_RANK0_LOG_FILES = "rank0_log_files"


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
        dict_config = call.qname == LOG_DICT_CONFIG
        if stmt is None or not (handler or basic or dict_config):
            continue
        if id(stmt) in ctx.facts.under_rank_test or ctx.suppressed(call.node, _STEP):
            continue
        if mentions_rank(call.node):
            continue  # a log file per rank already
        if dict_config:
            _plan_dict_config(ctx, call)
            continue
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


def _plan_dict_config(ctx: FileContext, call: CallFact) -> None:
    """``dictConfig(config)`` -> ``dictConfig(mn.rank0_log_files(config, comm))``."""
    stmt = call.stmt
    assert stmt is not None
    config = call.node.args[0] if call.node.args else None
    if config is None or config.keyword is not None or config.star:
        return
    made = ctx.facts.call_of(config.value)
    if made is not None and vocab.is_runtime_name(made.qname, _RANK0_LOG_FILES):
        return  # converted before
    if ctx.plan.is_guarded(stmt):
        return
    if ctx.before_comm_exists(stmt):
        ctx.note(
            call.node,
            _STEP,
            "needs-person",
            "every rank runs this logging configuration, set up before the communicator exists: "
            "its file handlers would append to one file from every rank; let rank 0 keep them",
        )
        return
    comm = ctx.comm_at(call.func, _STEP)
    if comm is None or ctx.options.target != "mnify":
        ctx.note(
            call.node,
            _STEP,
            "needs-person",
            "every rank runs this logging configuration: give the ranks other than 0 console "
            "handlers instead of its file handlers",
        )
        return
    ctx.use_runtime()
    value = f"{ctx.spell.top(_RANK0_LOG_FILES)}({ctx.code(config.value)}, {comm})"
    ctx.plan.replace_node(config, _arg_value(value), stmt)
    ctx.note(
        call.node,
        _STEP,
        "changed",
        "logging.config.dictConfig: rank 0 keeps the configuration's log files, the other ranks "
        f"log to the console instead ({ctx.spell.top(_RANK0_LOG_FILES)}(config, {comm}))",
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
