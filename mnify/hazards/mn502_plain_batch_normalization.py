"""MN502 ``plain-batch-normalization``: plain BatchNormalization in a data-parallel script: statistics
are per rank.

Its documentation (docs/rules.md, ``mnify explain MN502``) is generated from the rule class below.
The fix is here too: :func:`fix`, the converter step ``batchnorm`` (MN807, docs/converter.md).
Fixture: fixtures/lint/MN502.py.

Family: MN5xx: pieces a data-parallel script needs on every rank (docs/design.md §1): scattered
data, a multi-node optimizer, multi-node batch normalization, a multi-node evaluator.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Finding, Rule
from mnify.program.context import LintContext
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import expression, statement
from mnify.rewrites.registry import rewrite


class PlainBatchNormalization(Rule):
    """Fires on each ``chainer.links.BatchNormalization(...)`` construction (any import style or
    alias) in a data-parallel script whose program (this file or another) never calls
    ``create_mnbn_model`` (which converts a built model's BatchNormalization links where the model
    is built, ChainerMN's way)."""

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

    def answered_elsewhere(self, finding: Finding, function: str | None) -> bool:
        """Not when another file converts the model where it builds it."""
        return self.ctx.project.batch_normalization_converted


# ------------------------------------------------------------------------------------ fix
FIX_DOC = """docs/design.md §1, step "batch norm": statistics over the global batch, not each shard.

``L.BatchNormalization(size, ...)`` becomes ``mn.links.MultiNodeBatchNormalization(size, comm,
...)``. Inside a model class of a converted file the class's ``__init__`` gains a keyword-only
``comm`` parameter and every construction of the class (in any file of the conversion) passes
``comm=comm``. For a model defined in a file that is not being converted (a sibling ``net.py``
left out, or Chainer's ResNets), ``model = mn.links.create_mnbn_model(model, comm)`` follows
the construction instead. Not under ``--model-parallel channel``: every rank sees the whole batch.
"""


# BatchNormalization's positional parameters after ``size`` (MultiNodeBatchNormalization puts
# ``comm`` second, so these must become keywords).
_BN_POSITIONAL = ("decay", "eps", "dtype", "use_gamma", "use_beta", "initial_gamma", "initial_beta")
_ONE_LINE = 64  # longer replacements break after the opening parenthesis
_UNSUPPORTED = {"axis", "initial_avg_mean", "initial_avg_var"}


@rewrite("batchnorm", order=70, fixes=("MN502",), code="MN807", doc=FIX_DOC)
def fix(ctx: FileContext) -> None:
    if not ctx.options.data_parallel:
        return
    mnbn = ctx.spell.links("MultiNodeBatchNormalization")
    for call in ctx.facts.calls:
        if not N.is_link(call.qname, "BatchNormalization"):
            continue
        if ctx.suppressed(call.node, "batchnorm"):
            continue
        keywords = {a.keyword.value for a in call.node.args if a.keyword is not None}
        positional = [a for a in call.node.args if a.keyword is None]
        if any(a.star for a in call.node.args):
            ctx.note(
                call.node, "batchnorm", "needs-person", "BatchNormalization(*args): convert by hand"
            )
            continue
        if not positional and "size" not in keywords:
            ctx.note(
                call.node,
                "batchnorm",
                "needs-person",
                "BatchNormalization without a size cannot become MultiNodeBatchNormalization",
            )
            continue
        bad = sorted(keywords & _UNSUPPORTED)
        if bad or len(positional) > 1 + len(_BN_POSITIONAL):
            ctx.note(
                call.node,
                "batchnorm",
                "needs-person",
                f"BatchNormalization with {', '.join(bad) or 'extra arguments'} has no "
                "multi-node equivalent: left as is (statistics stay per rank)",
            )
            continue
        comm = ctx.comm_at(call.func, "BatchNormalization")
        if comm is None:
            if ctx.lift(call.func, "mnbn", "BatchNormalization", call.node):
                continue  # the built model is converted where it is built (call_sites)
            ctx.note(
                call.node,
                "batchnorm",
                "needs-person",
                "BatchNormalization built where the communicator is not in scope: convert the "
                f"model with {ctx.spell.links('create_mnbn_model')}(model, comm) where it is built",
            )
            continue
        ctx.use_runtime()
        ctx.plan.replace_node(call.node, _to_mnbn(mnbn, comm), call.stmt)
        ctx.note(call.node, "batchnorm", "changed", f"BatchNormalization -> {mnbn}(..., comm)")
    _wrap_external_models(ctx, ctx.external_bn)


def _to_mnbn(func: str, comm: str) -> Callable[[cst.CSTNode], cst.CSTNode]:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        args = list(node.args)
        out: list[cst.Arg] = []
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        positional = [a for a in args if a.keyword is None]
        rest = [a for a in args if a.keyword is not None]
        eq = cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        )
        if positional:
            out.append(positional[0].with_changes(comma=comma))
            out.append(cst.Arg(expression(comm), comma=comma))
            for name, arg in zip(_BN_POSITIONAL, positional[1:], strict=False):
                out.append(arg.with_changes(keyword=cst.Name(name), equal=eq, comma=comma))
        else:
            rest.append(cst.Arg(expression(comm), keyword=cst.Name("comm"), equal=eq))
        out.extend(a.with_changes(comma=comma) for a in rest)
        out[-1] = out[-1].with_changes(comma=args[-1].comma)
        changed = node.with_changes(func=expression(func), args=out)
        if len(cst.Module([]).code_for_node(changed)) > _ONE_LINE:
            # break after the parenthesis, as black would, instead of one very long line
            changed = changed.with_changes(
                whitespace_before_args=cst.ParenthesizedWhitespace(
                    first_line=cst.TrailingWhitespace(),
                    indent=True,
                    last_line=cst.SimpleWhitespace("    "),
                )
            )
        return changed

    return fn


def _wrap_external_models(ctx: FileContext, external_bn: Callable[[str], bool]) -> None:
    """``model = mn.links.create_mnbn_model(model, comm)`` after models defined elsewhere."""
    already = {
        a.targets[0]
        for a in ctx.facts.assigns
        if len(a.targets) == 1
        and isinstance(a.value, cst.Call)
        and N.is_mnbn_factory(getattr(ctx.facts.call_of(a.value), "qname", ""))
    }
    done: set[int] = set()
    for call in ctx.facts.calls:
        q = call.qname
        library = N.is_library_bn_model(q)
        if not (library or (q and not N.is_chainer_name(q) and external_bn(q))):
            continue
        stmt = call.stmt
        if stmt is None or id(stmt) in done:
            continue
        done.add(id(stmt))
        target = next(
            (a.targets[0] for a in ctx.facts.assigns if a.stmt is stmt and len(a.targets) == 1),
            None,
        )
        if target is None or target in already:
            if target is None:
                ctx.note(
                    call.node,
                    "batchnorm",
                    "needs-person",
                    f"{q} contains BatchNormalization: wrap the model with create_mnbn_model",
                )
            continue
        if ctx.suppressed(call.node, "batchnorm"):
            continue
        comm = ctx.comm_at(call.func, "create_mnbn_model")
        if comm is None:
            ctx.note(
                call.node, "batchnorm", "needs-person", f"wrap {target} with create_mnbn_model"
            )
            continue
        wrap = ctx.runtime.links("create_mnbn_model")
        ctx.plan.insert_after(stmt, [statement(f"{target} = {wrap}({target}, {comm})\n")])
        ctx.note(
            call.node,
            "batchnorm",
            "changed",
            f"{N.last(q)} is defined outside the converted files: {wrap}({target}, {comm})",
        )
