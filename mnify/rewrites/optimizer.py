"""docs/design.md §1, step "optimizer": wrap every Chainer optimizer for gradient averaging.

``opt = chainer.optimizers.Adam(...)`` becomes
``opt = mn.create_multi_node_optimizer(chainer.optimizers.Adam(...), comm)`` wherever it is
built: in the entry point, in a helper such as ``make_optimizer(model)`` (which then takes
``comm``), once per optimizer (a GAN has two). With ``--model-parallel channel`` optimizers stay
as they are: each rank owns different parameters, so there is nothing to average.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.facts import CallFact
from mnify.rewrites.registry import rewrite


@rewrite("optimizer", order=20, fixes=("MN503",), code="MN803")
def plan(ctx: FileContext) -> None:
    wrap = ctx.spell.top("create_multi_node_optimizer")
    for call in ctx.facts.calls:
        if not vocab.is_optimizer(call.qname) and not _by_getattr(ctx, call):
            continue
        label = _label(ctx, call)
        if vocab.is_multi_node_optimizer_factory(call.parent_qname):
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
        ctx.plan.replace_node(call.node, _wrap(wrap, comm), call.stmt)
        ctx.note(call.node, "optimizer", "changed", f"{label} -> {wrap}(..., comm)")


def names_module(ctx: FileContext, expr: cst.BaseExpression, module: str) -> bool:
    """``expr`` names the module ``module`` (``chainer.optimizers``, ``O`` imported as it)."""
    if isinstance(expr, cst.Name):
        return ctx.facts.imported_modules.get(expr.value) == module
    if isinstance(expr, cst.Attribute):
        return ctx.code(expr) == module or (
            isinstance(expr.value, cst.Name)
            and ctx.facts.imported_modules.get(expr.value.value, "") + "." + expr.attr.value
            == module
        )
    return False


def _by_getattr(ctx: FileContext, call: CallFact) -> bool:
    """``getattr(chainer.optimizers, cfg['name'])(**kwargs)``: an optimizer class chosen by
    name from Chainer's optimizer module."""
    made = ctx.facts.call_of(call.node.func)
    return (
        made is not None
        and made.qname in ("getattr", "builtins.getattr")
        and bool(made.node.args)
        and names_module(ctx, made.node.args[0].value, vocab.OPTIMIZERS_MODULE)
    )


def _an_optimizer(name: str) -> str:
    """``an Adam optimizer``, ``a MomentumSGD optimizer``; ``an optimizer chosen by name``."""
    if name.startswith("an optimizer"):
        return name
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name} optimizer"


def _label(ctx: FileContext, call: CallFact) -> str:
    return "an optimizer chosen by name" if _by_getattr(ctx, call) else vocab.last(call.qname)


# A wrapped call longer than this breaks after the opening parenthesis, as black would.
_ONE_LINE = 48


def _wrap(func: str, comm: str) -> NodeFn:
    """A replace-fn turning ``X(...)`` into ``func(X(...), comm)``."""

    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.BaseExpression)
        inner = cst.Module([]).code_for_node(node)
        ws: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace("")
        if len(inner) > _ONE_LINE and "\n" not in inner:
            ws = cst.ParenthesizedWhitespace(
                first_line=cst.TrailingWhitespace(),
                indent=True,
                last_line=cst.SimpleWhitespace("    "),
            )
        return cst.Call(
            func=expression(func),
            whitespace_before_args=ws,
            args=[
                cst.Arg(node, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(expression(comm)),
            ],
        )

    return fn


wrap_call = _wrap
