"""MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered data, a
multi-node optimizer, multi-node batch normalization, a multi-node evaluator."""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.lint.context import LintContext
from mnify.lint.rule import AppliesTo, Rule
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


class _WrapTracker(Rule):
    """Shared bookkeeping: constructions of some class and whether a factory wraps them,
    directly (``factory(Cls(...), comm)``) or through the name they are assigned to."""

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self.constructions: list[cst.Call] = []
        self.assigned_to: dict[int, str] = {}
        self.wrapped_ids: set[int] = set()
        self.wrapped_names: set[str] = set()
        self.returned_ids: set[int] = set()
        self.returned_names: set[str] = set()
        self.wrapper_calls = 0

    def is_construction(self, names: frozenset[str]) -> bool:
        raise NotImplementedError

    def is_wrapper(self, names: frozenset[str]) -> bool:
        raise NotImplementedError

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call):
            for target in node.targets:
                name = dotted_name(target.target)
                if name is not None:
                    self.assigned_to[id(node.value)] = name

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is None:
            return
        if isinstance(node.value, cst.Call):
            self.returned_ids.add(id(node.value))
        name = dotted_name(node.value)
        if name is not None:
            self.returned_names.add(name)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Call):
            return  # ``Evaluator(...)()`` calls what the inner call built: that one counts
        names = self.ctx.callee_names(node)
        if not names:
            return
        if self.is_wrapper(names):
            self.wrapper_calls += 1
            wrapped = argument(node, 0, "actual_optimizer", "evaluator")
            if isinstance(wrapped, cst.Call):
                self.wrapped_ids.add(id(wrapped))
            elif wrapped is not None:
                name = dotted_name(wrapped)
                if name is not None:
                    self.wrapped_names.add(name)
        elif self.is_construction(names):
            self.constructions.append(node)

    def unwrapped(self) -> list[cst.Call]:
        """Constructions never wrapped. A construction returned from a helper counts as wrapped
        when the file wraps something (the caller wraps the helper's result)."""
        result = []
        for call in self.constructions:
            name = self.assigned_to.get(id(call))
            if id(call) in self.wrapped_ids or (name is not None and name in self.wrapped_names):
                continue
            returned = id(call) in self.returned_ids or (
                name is not None and name in self.returned_names
            )
            if returned and self.wrapper_calls:
                continue
            result.append(call)
        return result


class OptimizerNotMultiNode(_WrapTracker):
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


class PlainEvaluator(_WrapTracker):
    """Fires on each ``chainer.training.extensions.Evaluator(...)`` construction in a
    data-parallel script that is not passed to ``create_multi_node_evaluator`` directly or
    through the variable it is assigned to."""

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

    def is_construction(self, names: frozenset[str]) -> bool:
        return N.any_is(names, N.is_evaluator)

    def is_wrapper(self, names: frozenset[str]) -> bool:
        return N.any_in(names, N.MULTI_NODE_EVALUATOR_FACTORIES)

    def finish(self) -> None:
        for call in self.unwrapped():
            self.report(call)


class NoScatterDataset(Rule):
    """Fires on the first ``chainer.iterators`` iterator construction (``SerialIterator``,
    ``MultiprocessIterator``, ``MultithreadIterator``) of a data-parallel script that never calls
    ``scatter_dataset`` or ``scatter_index``."""

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
