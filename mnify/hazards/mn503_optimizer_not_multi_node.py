"""MN503 ``optimizer-not-multi-node``: optimizer is not multi-node: gradients are never averaged
across ranks.

Its documentation (docs/rules.md, ``mnify explain MN503``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``optimizer`` (mnify/rewrites/optimizer.py,
docs/converter.md). Fixture: fixtures/lint/MN503.py.

Family: MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered
data, a multi-node optimizer, multi-node batch normalization, a multi-node evaluator.
"""

from __future__ import annotations

from mnify import vocabulary as N
from mnify.hazards.wrap_tracking import WrapTracker
from mnify.lint.rule import AppliesTo


class OptimizerNotMultiNode(WrapTracker):
    """Fires on each ``chainer.optimizers.<Optimizer>(...)`` construction in a data-parallel
    script that is not passed to ``create_multi_node_optimizer`` directly or through the variable
    it is assigned to (a construction returned from a helper counts as wrapped when the file
    wraps something)."""

    code = "MN503"
    name = "optimizer-not-multi-node"
    summary = "optimizer is not multi-node: gradients are never averaged across ranks"
    why = (
        "A plain optimizer updates each rank's model with its own gradients: the replicas drift "
        "apart, and the job trains N unrelated models (the broadcast of initial parameters is "
        "skipped too). create_multi_node_optimizer averages gradients with an all-reduce."
    )
    bad = "comm = chainermn.create_communicator()\noptimizer = chainer.optimizers.Adam()\n"
    good = (
        "comm = chainermn.create_communicator()\n"
        "optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)\n"
    )
    fixable = True
    applies_to = AppliesTo.DATA_PARALLEL

    def is_construction(self, names: frozenset[str]) -> bool:
        return any(N.is_optimizer(name) for name in names)

    def is_wrapper(self, names: frozenset[str]) -> bool:
        return N.any_in(names, N.MULTI_NODE_OPTIMIZER_FACTORIES)

    def finish(self) -> None:
        for call in self.unwrapped():
            self.report(call)
