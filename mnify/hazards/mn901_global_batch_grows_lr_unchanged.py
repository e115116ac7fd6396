"""MN901 ``global-batch-grows-lr-unchanged``: global batch grows with the number of ranks while the
learning rate is unchanged.

Its documentation (docs/rules.md, ``mnify explain MN901``) is generated from the rule class below.
Fixture: fixtures/lint/MN901.py.

Family: MN9xx: information and preview rules, off by default (select them explicitly).
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Rule
from mnify.program.context import LintContext
from mnify.syntax import argument

_LEARNING_RATE_KEYWORDS = ("lr", "alpha", "eta")


class GlobalBatchGrowsLearningRateUnchanged(Rule):
    """Fires, in a data-parallel script, on each optimizer construction wrapped by
    ``create_multi_node_optimizer`` (directly or through its variable) when the learning rate
    does not depend on the number of ranks and the global batch grows with it. Precisely: no
    ``chainer.iterators`` batch-size argument mentions the communicator size (``comm.size``,
    ``Get_size()``, a variable assigned from one: that is strong scaling), the construction's
    learning rate (first positional, ``lr=``, ``alpha=`` or ``eta=``) does not mention it, and no
    assignment to an ``.lr``/``.alpha``/``.eta`` attribute mentions it."""

    code = "MN901"
    name = "global-batch-grows-lr-unchanged"
    summary = "global batch grows with the number of ranks while the learning rate is unchanged"
    why = (
        "With weak scaling (ChainerMN's default) the global batch is N times the per-rank "
        "batch, so each update averages N times more examples; keeping the single-GPU learning "
        "rate takes N times fewer, equally sized steps per epoch and usually converges slower. "
        "The linear scaling rule (lr * comm.size, with warm-up) or strong scaling keep results "
        "comparable. Information only: some recipes deliberately keep the rate."
    )
    bad = (
        "comm = chainermn.create_communicator()\n"
        "optimizer = chainermn.create_multi_node_optimizer(\n"
        "    chainer.optimizers.MomentumSGD(lr=0.1), comm)\n"
        "train_iter = chainer.iterators.SerialIterator(train, 32)\n"
    )
    good = (
        "comm = chainermn.create_communicator()\n"
        "optimizer = chainermn.create_multi_node_optimizer(\n"
        "    chainer.optimizers.MomentumSGD(lr=0.1 * comm.size), comm)\n"
        "train_iter = chainer.iterators.SerialIterator(train, 32)\n"
    )
    default_enabled = False
    applies_to = AppliesTo.DATA_PARALLEL

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._wrapped: list[cst.Call] = []
        self._batch_scaled = False
        self._lr_scaled = False

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        names = ctx.callee_names(node)
        if N.any_in(names, N.MULTI_NODE_OPTIMIZER_FACTORIES):
            inner = argument(node, 0, "actual_optimizer")
            if inner is not None and not isinstance(inner, cst.Call):
                bound = ctx.binding(inner)
                inner = bound.value if bound is not None else None
            if isinstance(inner, cst.Call) and ctx.builds_optimizer(inner):
                self._wrapped.append(inner)
        elif N.any_is(names, N.is_iterator):
            batch = argument(node, 1, "batch_size")
            if batch is not None and ctx.mentions_comm_size(batch):
                self._batch_scaled = True

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            attr = target.target
            if (
                isinstance(attr, cst.Attribute)
                and attr.attr.value in _LEARNING_RATE_KEYWORDS
                and self.ctx.mentions_comm_size(node.value)
            ):
                self._lr_scaled = True

    def finish(self) -> None:
        if self._batch_scaled or self._lr_scaled:
            return
        for call in self._wrapped:
            rate = argument(call, 0, *_LEARNING_RATE_KEYWORDS)
            if rate is None or not self.ctx.mentions_comm_size(rate):
                self.report(call)
