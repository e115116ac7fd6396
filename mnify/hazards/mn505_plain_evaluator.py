"""MN505 ``plain-evaluator``: plain Evaluator in a data-parallel script reports one rank's shard only.

Its documentation (docs/rules.md, ``mnify explain MN505``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``evaluator`` (mnify/rewrites/evaluator.py,
docs/converter.md). Fixture: fixtures/lint/MN505.py.

Family: MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered
data, a multi-node optimizer, multi-node batch normalization, a multi-node evaluator.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Finding
from mnify.hazards.wrap_tracking import WrapTracker


class PlainEvaluator(WrapTracker):
    """Fires on each ``chainer.training.extensions.Evaluator(...)`` construction in a
    data-parallel script that is not passed to ``create_multi_node_evaluator`` directly or
    through the variable it is assigned to, unless the program calls ``distribute_trainers`` or
    the construction is in a helper whose call is followed by ``distribute_extensions``."""

    code = "MN505"
    name = "plain-evaluator"
    summary = "plain Evaluator in a data-parallel script reports one rank's shard only"
    why = (
        "With a scattered test set each rank evaluates its own shard; a plain Evaluator reports "
        "rank 0's shard as if it were the whole validation score. create_multi_node_evaluator "
        "averages the results over all ranks."
    )
    bad = "comm = chainermn.create_communicator()\ntrainer.extend(extensions.Evaluator(test_iter, model))\n"
    good = (
        "comm = chainermn.create_communicator()\n"
        "trainer.extend(\n"
        "    chainermn.create_multi_node_evaluator(extensions.Evaluator(test_iter, model), comm)\n"
        ")\n"
    )
    fixable = True
    applies_to = AppliesTo.DATA_PARALLEL

    def is_construction(self, node: cst.Call, names: frozenset[str]) -> bool:
        return N.any_is(names, N.is_evaluator)

    def is_wrapper(self, names: frozenset[str]) -> bool:
        return N.any_in(names, N.MULTI_NODE_EVALUATOR_FACTORIES)

    def finish(self) -> None:
        for call in self.unwrapped():
            self.report(call)

    def answered_elsewhere(self, finding: Finding, function: str | None) -> bool:
        """Not when the program calls ``distribute_trainers``, which converts it at run time,
        nor in a helper whose call ``distribute_extensions`` follows."""
        project = self.ctx.project
        return project.trainers_distributed_at_run_time or (
            function is not None and function in project.extension_helpers_distributed
        )
