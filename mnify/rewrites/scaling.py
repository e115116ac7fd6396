"""DESIGN.md section 1, step "scaling": ``--scaling strong`` keeps the global batch size.

Weak scaling (ChainerMN's default) leaves the per-rank batch as written, so N ranks train with
N times the batch. Strong scaling divides the training iterators' batch size by ``comm.size``
and, before the iterator is built, raises a clear error when it does not divide.
"""

from __future__ import annotations

import libcst as cst

from mnify.rewrites.context import FileContext
from mnify.rewrites.dataset import is_training_iterator, iterator_calls
from mnify.rewrites.edits import expression, statement
from mnify.rewrites.registry import rewrite


def _batch_arg(call: cst.Call) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "batch_size":
            return arg
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[1] if len(positional) > 1 else None


@rewrite("scaling", order=50, code="MN809")
def plan(ctx: FileContext) -> None:
    if ctx.options.scaling != "strong":
        return
    if not ctx.options.data_parallel:
        ctx.note(None, "scaling", "info", "--scaling strong ignored under model parallelism")
        return
    for call in iterator_calls(ctx):
        if not is_training_iterator(call.node) or call.stmt is None:
            continue
        arg = _batch_arg(call.node)
        if arg is None:
            ctx.note(
                call.node, "scaling", "needs-person", "batch size not found: divide it by hand"
            )
            continue
        batch = ctx.code(arg.value)
        if "comm" in batch and ".size" in batch:
            continue  # converted before
        if ctx.suppressed(call.node, "scaling"):
            continue
        comm = ctx.comm_at(call.func, "batch size")
        if comm is None:
            ctx.note(call.node, "scaling", "needs-person", "divide the batch size by comm.size")
            continue
        simple = isinstance(arg.value, (cst.Name, cst.Attribute, cst.Integer, cst.Subscript))
        operand = batch if simple else f"({batch})"
        check = statement(
            f"if {operand} % {comm}.size != 0:\n"
            "    raise ValueError(\n"
            f"        {ctx.q('--scaling strong: global batch size %d does not divide by %d ranks')}\n"
            f"        % ({operand}, {comm}.size)\n"
            "    )\n"
        )
        ctx.plan.insert_before(call.stmt, [check])
        value = f"{operand} // {comm}.size"

        def fn(node: cst.CSTNode, value: str = value) -> cst.CSTNode:
            assert isinstance(node, cst.Arg)
            return node.with_changes(value=expression(value))

        ctx.plan.replace_node(arg, fn, call.stmt)
        ctx.note(call.node, "scaling", "changed", f"per-rank batch = {batch} // {comm}.size")
