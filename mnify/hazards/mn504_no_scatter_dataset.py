"""MN504 ``no-scatter-dataset``: no scatter_dataset: every rank trains on the same examples.

Its documentation (docs/rules.md, ``mnify explain MN504``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``dataset`` (mnify/rewrites/dataset.py, docs/converter.md).
Fixture: fixtures/lint/MN504.py.

Family: MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered
data, a multi-node optimizer, multi-node batch normalization, a multi-node evaluator.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Finding, Rule
from mnify.program.context import LintContext


class NoScatterDataset(Rule):
    """Fires on the first ``chainer.iterators`` iterator construction (``SerialIterator``,
    ``MultiprocessIterator``, ``MultithreadIterator``) of a data-parallel script that never calls
    ``scatter_dataset`` or ``scatter_index`` and whose program never calls
    ``distribute_trainers``."""

    code = "MN504"
    name = "no-scatter-dataset"
    summary = "no scatter_dataset: every rank trains on the same examples"
    why = (
        "Without scattering, each rank iterates over the full dataset in the same order: N "
        "ranks compute N copies of the same gradient, so the job is N times the cost of one GPU "
        "for no gain (an epoch also takes as long as on one GPU)."
    )
    bad = "comm = chainermn.create_communicator()\ntrain_iter = chainer.iterators.SerialIterator(train, 32)\n"
    good = (
        "comm = chainermn.create_communicator()\n"
        "train = chainermn.scatter_dataset(train, comm, shuffle=True)\n"
        "train_iter = chainer.iterators.SerialIterator(train, 32)\n"
    )
    fixable = True
    applies_to = AppliesTo.DATA_PARALLEL

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._first_iterator: cst.Call | None = None
        self._scattered = False

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.callee_names(node)
        if N.any_in(names, N.SCATTER_FUNCTIONS):
            self._scattered = True
        elif self._first_iterator is None and N.any_is(names, N.is_iterator):
            self._first_iterator = node

    def finish(self) -> None:
        if not self._scattered and self._first_iterator is not None:
            self.report(self._first_iterator)

    def answered_elsewhere(self, finding: Finding, function: str | None) -> bool:
        """Not when the program calls ``distribute_trainers``, which converts it at run time."""
        project = self.ctx.project
        return project.trainers_distributed_at_run_time
