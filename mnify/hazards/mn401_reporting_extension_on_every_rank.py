"""MN401 ``reporting-extension-on-every-rank``: writing/reporting extension registered on every rank.

Its documentation (docs/rules.md, ``mnify explain MN401``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``rank0-guard`` (mnify/rewrites/guards.py,
docs/converter.md). Fixture: fixtures/lint/MN401.py.

Family: MN4xx: output (report extensions, saved files, prints) belongs on one rank.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Finding, Rule
from mnify.program.context import LintContext
from mnify.syntax import log_name_by_rank

# the extensions ``distribute_trainers`` registers on rank 0 only (mnify/runtime/trainers.py)
RUN_TIME_GUARDED_WRITERS = frozenset(
    {
        "LogReport",
        "PrintReport",
        "ProgressBar",
        "PlotReport",
        "DumpGraph",
        "dump_graph",
        "VariableStatisticsPlot",
        "snapshot",
        "snapshot_object",
    }
)


class UnguardedReportingExtension(Rule):
    """Fires, in a distributed script, on ``X.extend(E, ...)`` where ``E`` is a call of (or a
    variable assigned from) ``LogReport``, ``PrintReport``, ``ProgressBar``, ``PlotReport``,
    ``snapshot``/``Snapshot``, ``snapshot_object``, ``DumpGraph``/``dump_graph`` or
    ``VariableStatisticsPlot`` from ``chainer.training.extensions``, and the call runs on every
    rank: not inside a rank-conditional ``if`` and not after a rank-conditional early exit. A
    ``LogReport`` whose ``log_name`` depends on the rank (``'log' if comm.rank == 0 else None``)
    writes on one rank: kept on every rank so the script can read its log back. Not when the
    program calls ``distribute_trainers`` (which registers Chainer's writers on rank 0 only when
    the Trainer runs), nor inside a helper whose call is followed by ``distribute_extensions``."""

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

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._labels: dict[int, str] = {}  # id of a reported extension -> its class's name

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "extend" and node.args):
            return
        extension = node.args[0].value
        label = self._reporting_name(extension)
        if label == "LogReport" and self._log_name_by_rank(extension):
            return
        if label is not None and not self.ctx.on_some_ranks():
            self._labels[id(extension)] = label
            self.report(
                extension,
                f"`{label}` registered on every rank; register it under `if comm.rank == 0:`",
            )

    def answered_elsewhere(self, finding: Finding, function: str | None) -> bool:
        """Not for Chainer's writers when ``distribute_trainers`` guards them at run time, nor
        in a helper whose extensions ``distribute_extensions`` distributes after it returns."""
        project = self.ctx.project
        if function is not None and function in project.extension_helpers_distributed:
            return True
        label = self._labels.get(id(finding.node))
        return project.trainers_distributed_at_run_time and label in RUN_TIME_GUARDED_WRITERS

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
