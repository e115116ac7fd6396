"""MN4xx: output (report extensions, saved files, prints) belongs on one rank."""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.lint.rule import AppliesTo, Rule
from mnify.syntax import argument, log_name_by_rank, string_value


class UnguardedReportingExtension(Rule):
    """Fires, in a distributed script, on ``X.extend(E, ...)`` where ``E`` is a call of (or a
    variable assigned from) ``LogReport``, ``PrintReport``, ``ProgressBar``, ``PlotReport``,
    ``snapshot``/``Snapshot``, ``snapshot_object``, ``DumpGraph``/``dump_graph`` or
    ``VariableStatisticsPlot`` from ``chainer.training.extensions``, and the call runs on every
    rank: not inside a rank-conditional ``if`` and not after a rank-conditional early exit. A
    ``LogReport`` whose ``log_name`` depends on the rank (``'log' if comm.rank == 0 else None``)
    writes on one rank: kept on every rank so the script can read its log back."""

    code = "MN401"
    name = "reporting-extension-on-every-rank"
    summary = "writing/reporting extension registered on every rank"
    why = (
        "Every rank writes the same log, plot and snapshot files at the same paths (clobbered or "
        "corrupt files on a shared file system) and prints N copies of each progress line. "
        "Register them on rank 0 only; evaluators and learning-rate schedules stay on all ranks."
    )
    bad = "comm = chainermn.create_communicator()\ntrainer.extend(extensions.LogReport())\n"
    good = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    trainer.extend(extensions.LogReport())\n"
    )
    fixable = True
    applies_to = AppliesTo.DISTRIBUTED

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "extend" and node.args):
            return
        extension = node.args[0].value
        label = self._reporting_name(extension)
        if label == "LogReport" and self._log_name_by_rank(extension):
            return
        if label is not None and not self.ctx.on_some_ranks():
            self.report(
                extension,
                f"`{label}` registered on every rank; register it under `if comm.rank == 0:`",
            )

    def _log_name_by_rank(self, expr: cst.BaseExpression) -> bool:
        if not isinstance(expr, cst.Call):
            bound = self.ctx.binding(expr)
            if bound is None or not isinstance(bound.value, cst.Call):
                return False
            expr = bound.value
        return log_name_by_rank(expr)

    def _reporting_name(self, expr: cst.BaseExpression) -> str | None:
        if isinstance(expr, cst.Call):
            for name in self.ctx.callee_names(expr):
                if N.is_reporting_extension(name):
                    return name.rsplit(".", 1)[1]
            return None
        bound = self.ctx.binding(expr)
        if bound is not None and bound.kind == "report_ext" and isinstance(bound.value, cst.Call):
            return self._reporting_name(bound.value)
        return None


class FileSavedOnEveryRank(Rule):
    """Fires, in a distributed script, on a call that writes a file and runs on every rank (not
    inside a rank-conditional ``if``, not after a rank-conditional early exit) when the path it
    writes (its first argument or ``file=``) does not mention a rank, so every rank writes the
    same path: ``chainer.serializers.save_*``, ``np.save``/``savez``/``savetxt``,
    ``pickle.dump``/``json.dump`` (which write to a file object), ``savefig``, image writers
    (``cv2.imwrite``, ``imageio.imwrite``, ``PIL.Image...save``), ``shutil`` copies, and
    ``open(path, 'w'/'a'/'x')``."""

    code = "MN402"
    name = "file-saved-on-every-rank"
    summary = "every rank saves to the same file"
    why = (
        "All ranks write the same path at the same time: on a shared file system the file ends "
        "up truncated or interleaved, and N-1 of the writes are wasted I/O. Save on rank 0, or "
        "put the rank in the file name when each rank really has its own state."
    )
    bad = (
        "comm = chainermn.create_communicator()\nchainer.serializers.save_npz('model.npz', model)\n"
    )
    good = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    chainer.serializers.save_npz('model.npz', model)\n"
    )
    fixable = True
    applies_to = AppliesTo.DISTRIBUTED

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.on_some_ranks() or not self._writes(node):
            return
        target = argument(node, 0, "file")
        if target is not None and ctx.find_rank(target, ("global", "intra", "inter")):
            return
        self.report(node)

    def _writes(self, node: cst.Call) -> bool:
        names = self.ctx.callee_names(node)
        if N.any_is(names, N.is_file_writer) and not N.any_in(names, N.DIRECTORY_MAKERS):
            return True
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in N.WRITER_METHODS:
            return True
        if N.any_in(names, N.OPEN_FUNCTIONS):
            mode = argument(node, 1, "mode")
            text = string_value(mode) if mode is not None else None
            return text is not None and any(flag in text for flag in N.WRITE_MODES)
        return False


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
