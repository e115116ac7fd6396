"""MN502 ``plain-batch-normalization``: plain BatchNormalization in a data-parallel script: statistics
are per rank.

Its documentation (docs/rules.md, ``mnify explain MN502``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``batchnorm`` (mnify/rewrites/batchnorm.py,
docs/converter.md). Fixture: fixtures/lint/MN502.py.

Family: MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered
data, a multi-node optimizer, multi-node batch normalization, a multi-node evaluator.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.lint.context import LintContext
from mnify.lint.rule import AppliesTo, Rule


class PlainBatchNormalization(Rule):
    """Fires on each ``chainer.links.BatchNormalization(...)`` construction (any import style or
    alias) in a data-parallel script that never calls ``create_mnbn_model`` (which converts a
    built model's BatchNormalization links where the model is built, ChainerMN's way)."""

    code = "MN502"
    name = "plain-batch-normalization"
    summary = "plain BatchNormalization in a data-parallel script: statistics are per rank"
    why = (
        "Each rank normalises with the mean and variance of its own small per-rank batch, so "
        "training no longer matches the single-GPU run with the global batch and suffers with "
        "small per-rank batches. MultiNodeBatchNormalization computes them over all ranks."
    )
    bad = "comm = chainermn.create_communicator()\nself.bn = L.BatchNormalization(64)\n"
    good = "comm = chainermn.create_communicator()\nself.bn = chainermn.links.MultiNodeBatchNormalization(64, comm)\n"
    fixable = True
    applies_to = AppliesTo.DATA_PARALLEL

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._converted_where_built = False

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.callee_names(node)
        if N.any_is(names, N.is_batch_normalization):
            self.report(node)
        elif N.any_is(names, N.is_mnbn_factory):
            self._converted_where_built = True

    def finish(self) -> None:
        if self._converted_where_built:
            self.findings.clear()
