"""Wrapping a construction in a multi-node factory, ``X(...)`` -> ``factory(X(...), comm)``: the
edit the optimizer, evaluator, model-parallel and call-site steps share (docs/design.md §1)."""

from __future__ import annotations

import libcst as cst

from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression


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


# A wrapped call longer than this breaks after the opening parenthesis, as black would.
_ONE_LINE = 48


def wrap_call(func: str, comm: str) -> NodeFn:
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
