"""MN403 ``log-file-on-every-rank``: every rank logs to the same file.

Its documentation (docs/rules.md, ``mnify explain MN403``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``log-file`` (mnify/rewrites/log_files.py,
docs/converter.md). Fixture: fixtures/lint/MN403.py.

Family: MN4xx: output (report extensions, saved files, prints) belongs on one rank.
"""

from __future__ import annotations

import libcst as cst

from mnify.lint.rule import AppliesTo, Rule
from mnify.syntax import argument

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
