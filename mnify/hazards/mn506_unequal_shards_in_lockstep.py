"""MN506 ``unequal-shards-in-lockstep``: unequal shards feed a training loop whose every step is a
collective.

Its documentation (docs/rules.md, ``mnify explain MN506``) is generated from the rule class below.
Fixture: fixtures/lint/MN506.py.

Family: MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered
data, a multi-node optimizer, multi-node batch normalization, a multi-node evaluator.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Rule
from mnify.program.context import LintContext
from mnify.syntax import argument


class UnequalShardsInLockstep(Rule):
    """Fires, in a distributed script, on ``scatter_dataset(..., force_equal_length=False)``
    when the script steps in lockstep over its batches: it runs ``trainer.run()``, or a loop
    calls ``update()`` of a multi-node optimizer or another collective."""

    code = "MN506"
    name = "unequal-shards-in-lockstep"
    summary = "unequal shards feed a training loop whose every step is a collective"
    why = (
        "With force_equal_length=False the shards differ in length by up to one example, so "
        "ranks run different numbers of iterations per epoch. Every iteration all-reduces "
        "gradients: the rank with one batch more waits in a collective nobody else enters, and "
        "the job hangs at the end of the epoch. Keep the default (equal shards, padded)."
    )
    bad = (
        "comm = chainermn.create_communicator()\n"
        "train = chainermn.scatter_dataset(train, comm, force_equal_length=False)\n"
        "trainer = chainer.training.Trainer(updater, (10, 'epoch'))\n"
        "trainer.run()\n"
    )
    good = (
        "comm = chainermn.create_communicator()\n"
        "train = chainermn.scatter_dataset(train, comm)\n"
        "trainer = chainer.training.Trainer(updater, (10, 'epoch'))\n"
        "trainer.run()\n"
    )
    applies_to = AppliesTo.DISTRIBUTED

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._unequal: list[cst.Call] = []
        self._lockstep = False

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if N.any_in(ctx.callee_names(node), N.SCATTER_FUNCTIONS):
            flag = argument(node, 99, "force_equal_length")
            if isinstance(flag, cst.Name) and flag.value == "False":
                self._unequal.append(node)
            return
        key = ctx.collective_key(node)
        if key == "trainer.run" or (key is not None and ctx.loop_depth > 0):
            self._lockstep = True
        elif (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "run"
            and ctx.binding_kind(node.func.value) == "trainer"
        ):
            self._lockstep = True

    def finish(self) -> None:
        if self._lockstep:
            for node in self._unequal:
                self.report(node)
