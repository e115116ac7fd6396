"""MN503 ``optimizer-not-multi-node``: optimizer is not multi-node: gradients are never averaged
across ranks.

Its documentation (docs/rules.md, ``mnify explain MN503``) is generated from the rule class
below. The fix is here too: :func:`fix`, the converter step ``optimizer`` (MN803,
docs/converter.md), wraps each optimizer where it is built. Fixture: fixtures/lint/MN503.py.

Family: MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered
data, a multi-node optimizer, multi-node batch normalization, a multi-node evaluator.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Finding
from mnify.hazards.wrap_tracking import WrapTracker
from mnify.program.facts import CallFact
from mnify.rewrites.context import FileContext
from mnify.rewrites.registry import rewrite
from mnify.rewrites.wrapping import names_module, wrap_call


class OptimizerNotMultiNode(WrapTracker):
    """Fires on each construction of a Chainer optimizer (``chainer.optimizers.<Optimizer>(...)``,
    or a class of the project or of a package that derives from one; a class that only shares a
    name with one is none) in a data-parallel script that is not passed to
    ``create_multi_node_optimizer`` directly or through the variable it is assigned to (a
    construction returned from a helper counts as wrapped when the file wraps something, or when
    some file of the program passes that helper's result to ``create_multi_node_optimizer``),
    unless the program calls ``distribute_trainers``."""

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

    def is_construction(self, node: cst.Call, names: frozenset[str]) -> bool:
        return self.ctx.builds_optimizer(node)

    def is_wrapper(self, names: frozenset[str]) -> bool:
        return N.any_in(names, N.MULTI_NODE_OPTIMIZER_FACTORIES)

    def finish(self) -> None:
        for call in self.unwrapped():
            self.report(call)

    def answered_elsewhere(self, finding: Finding, function: str | None) -> bool:
        """Not when the program calls ``distribute_trainers``, which converts it at run time,
        nor in a helper whose result another file's call wraps."""
        project = self.ctx.project
        return project.trainers_distributed_at_run_time or (
            function is not None and function in project.optimizer_helpers_wrapped
        )


# ------------------------------------------------------------------------------------ fix
FIX_DOC = """docs/design.md §1, step "optimizer": wrap every Chainer optimizer for gradient averaging.

``opt = chainer.optimizers.Adam(...)`` becomes
``opt = mn.create_multi_node_optimizer(chainer.optimizers.Adam(...), comm)`` wherever it is
built: in the entry point, in a helper such as ``make_optimizer(model)`` (which then takes
``comm``), once per optimizer (a GAN has two). What a call builds is what its callee resolves
to, not its name (``LintContext.builds_optimizer``): the project's or a package's subclass of a
Chainer optimizer (``from optim import Adam``) is wrapped too; a class of the project that only
shares a name with one (its own ``SGD``) is left alone. With ``--model-parallel channel``
optimizers stay as they are: each rank owns different parameters, so there is nothing to average.
"""


@rewrite("optimizer", order=20, fixes=("MN503",), code="MN803", doc=FIX_DOC)
def fix(ctx: FileContext) -> None:
    """Wrap every optimizer this file builds where the communicator is in scope (see FIX_DOC)."""
    wrap = ctx.spell.top("create_multi_node_optimizer")
    for call in ctx.facts.calls:
        if not ctx.builds_optimizer(call) and not _by_getattr(ctx, call):
            continue
        label = _label(ctx, call)
        if N.is_multi_node_optimizer_factory(call.parent_qname):
            continue  # converted before
        if not ctx.options.data_parallel:
            ctx.note(
                call.node,
                "model-parallel",
                "info",
                f"{label} left unwrapped: under model parallelism each rank "
                "owns different parameters",
            )
            continue
        if ctx.suppressed(call.node, "optimizer"):
            continue
        comm = ctx.comm_at(call.func, label)
        if comm is None:
            scope = ctx.outermost_scope(call.func)
            if (
                isinstance(scope, cst.FunctionDef)
                and scope is call.func
                and ctx.returns_value_of(scope, call.node)
                and ctx.lift(call.func, "optimizer", _an_optimizer(label), call.node)
            ):
                continue  # the helper returns it: wrapped where the helper is called (call_sites)
            ctx.note(
                call.node,
                "optimizer",
                "needs-person",
                f"{label} is built where the communicator is not in scope "
                f"(a method): wrap it with {wrap}(..., comm) where it is used",
            )
            continue
        ctx.use_runtime()
        ctx.plan.replace_node(call.node, wrap_call(wrap, comm), call.stmt)
        ctx.note(call.node, "optimizer", "changed", f"{label} -> {wrap}(..., comm)")


def _by_getattr(ctx: FileContext, call: CallFact) -> bool:
    """``getattr(chainer.optimizers, cfg['name'])(**kwargs)``: an optimizer class chosen by
    name from Chainer's optimizer module."""
    made = ctx.facts.call_of(call.node.func)
    return (
        made is not None
        and made.qname in ("getattr", "builtins.getattr")
        and bool(made.node.args)
        and names_module(ctx, made.node.args[0].value, N.OPTIMIZERS_MODULE)
    )


def _an_optimizer(name: str) -> str:
    """``an Adam optimizer``, ``a MomentumSGD optimizer``; ``an optimizer chosen by name``."""
    if name.startswith("an optimizer"):
        return name
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name} optimizer"


def _label(ctx: FileContext, call: CallFact) -> str:
    return "an optimizer chosen by name" if _by_getattr(ctx, call) else N.last(call.qname)
