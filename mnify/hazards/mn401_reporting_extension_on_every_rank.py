"""MN401 ``reporting-extension-on-every-rank``: writing/reporting extension registered on every rank.

Its documentation (docs/rules.md, ``mnify explain MN401``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``rank0-guard`` (mnify/rewrites/guards.py,
docs/converter.md). Fixture: fixtures/lint/MN401.py.

Family: MN4xx: output (report extensions, saved files, prints) belongs on one rank.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.lint.rule import AppliesTo, Rule
from mnify.syntax import log_name_by_rank


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
