"""MN501 ``dataset-loaded-on-every-rank``: dataset loaded on every rank and then scattered.

Its documentation (docs/rules.md, ``mnify explain MN501``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``dataset`` (mnify/rewrites/dataset.py, docs/converter.md).
Fixture: fixtures/lint/MN501.py.

Family: MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered
data, a multi-node optimizer, multi-node batch normalization, a multi-node evaluator.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Rule
from mnify.syntax import argument, dotted_name


class DatasetLoadedOnEveryRank(Rule):
    """Fires on the dataset argument of ``scatter_dataset``/``scatter_index`` (called on every
    rank) when it is a call of a ``chainer.datasets`` function, or a variable whose last
    assignment before the scatter was a call (``get_mnist()``, ``load_data(...)``) made outside
    any rank-conditional branch. Loading under ``if comm.rank == 0:`` (others ``None``) is the
    fix and does not fire."""

    code = "MN501"
    name = "dataset-loaded-on-every-rank"
    summary = "dataset loaded on every rank and then scattered"
    why = (
        "`scatter_dataset` sends rank 0's dataset to everyone; loading it on every rank first "
        "makes each rank hold the whole dataset (N times the memory on a node, N times the "
        "file-system traffic) for nothing."
    )
    bad = (
        "comm = chainermn.create_communicator()\n"
        "train, test = chainer.datasets.get_mnist()\n"
        "train = chainermn.scatter_dataset(train, comm, shuffle=True)\n"
    )
    good = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    train, test = chainer.datasets.get_mnist()\n"
        "else:\n"
        "    train = None\n"
        "train = chainermn.scatter_dataset(train, comm, shuffle=True)\n"
    )
    fixable = True
    applies_to = AppliesTo.DISTRIBUTED

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if not N.any_in(ctx.callee_names(node), N.SCATTER_FUNCTIONS) or ctx.on_some_ranks():
            return
        dataset = argument(node, 0, "dataset")
        if dataset is None:
            return
        bound = ctx.binding(dataset)
        if bound is not None:
            if bound.kind in ("dataset", "call") and not bound.rank_conditional:
                self.report(
                    dataset,
                    f"`{dotted_name(dataset)}` is loaded on every rank (line {{line}}) and then "
                    "scattered; load it on rank 0 only and pass None elsewhere",
                    related=bound.value,
                )
        elif ctx.classify(dataset) == "dataset":
            self.report(dataset)
