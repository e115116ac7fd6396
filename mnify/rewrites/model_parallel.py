"""``--model-parallel channel`` (issue 5) and ``--model-parallel spatial`` (issue 25).

Spatial: the model class that holds the convolutions is wrapped where the entry point builds it,
``mn.links.create_spatial_parallel_model(Net(...), comm)`` (no signature changes); every rank
sees the same batch (iterators as below) and holds one slab of rows of every activation. The
report states what that does to memory per rank.

Channel:

Every rank sees the same batch and holds a slice of each convolution's channels:
``L.Convolution2D(in, out, ...)`` becomes ``mn.links.ParallelConvolution2D(comm, in, out, ...)``
where ``out >= comm.size`` (decided at run time: ``ParallelConvolution2D(...) if out >= comm.size
else L.Convolution2D(...)``, since the number of ranks is only known then); a layer whose input
channels are inferred lazily or fixed at 1 is left alone. Iterators are wrapped in
``mn.create_multi_node_iterator(it, comm)`` (rank 0 reads, every rank gets the batch); datasets
are not scattered and optimizers not wrapped (see those modules). Every conv gets a report line
saying whether and why it was split.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import expression
from mnify.rewrites.iterators import iterator_calls
from mnify.rewrites.registry import rewrite
from mnify.rewrites.wrapping import wrap_call


def _in_channels(call: cst.Call) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "in_channels":
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    has_ksize = any(a.keyword is not None and a.keyword.value == "ksize" for a in call.args)
    if len(positional) >= 3 or (len(positional) == 2 and has_ksize):
        return positional[0].value
    return None


def _out_channels(call: cst.Call) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "out_channels":
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[1].value if len(positional) >= 2 else None


@rewrite("model-parallel", order=40, code="MN810")
def plan(ctx: FileContext) -> None:
    if ctx.options.data_parallel:
        return
    _plan_iterators(ctx)
    if ctx.options.model_parallel == "spatial":
        _plan_spatial(ctx)
        return
    split = 0
    for call in ctx.facts.calls:
        if not vocab.is_link(call.qname, "Convolution2D"):
            continue
        siblings = ctx.facts.calls_by_stmt.get(id(call.stmt), []) if call.stmt else []
        if any(vocab.is_parallel_convolution(c.qname) for c in siblings):
            continue  # converted before
        if ctx.suppressed(call.node, "model-parallel"):
            continue
        label = ctx.code(call.node)
        channels = _in_channels(call.node)
        if channels is None or (isinstance(channels, cst.Name) and channels.value == "None"):
            ctx.note(
                call.node,
                "model-parallel",
                "info",
                f"not split: input channels are inferred lazily, unknown before the first batch ({label})",
            )
            continue
        out_channels = _out_channels(call.node)
        if out_channels is None:
            ctx.note(
                call.node,
                "model-parallel",
                "info",
                f"not split: its output channel count is not given where it is built ({label})",
            )
            continue
        if isinstance(out_channels, cst.Integer) and int(out_channels.value) < 2:
            ctx.note(
                call.node,
                "model-parallel",
                "info",
                f"not split: {out_channels.value} output channel cannot be divided among ranks "
                f"({label})",
            )
            continue
        if ctx.options.target == "chainermn":
            ctx.note(
                call.node,
                "model-parallel",
                "needs-person",
                f"not split: ChainerMN has no ParallelConvolution2D ({label})",
            )
            continue
        comm = ctx.comm_at(call.func, "ParallelConvolution2D")
        if comm is None:
            if ctx.lift(call.func, "channel-parallel", "convolutions", call.node):
                split += 1  # split where the model is built (call_sites), same condition
                ctx.note(
                    call.node,
                    "model-parallel",
                    "info",
                    f"split where its model is built, when its output channels reach comm.size "
                    f"({label})",
                )
                continue
            ctx.note(
                call.node,
                "model-parallel",
                "needs-person",
                f"not split: the communicator is not in scope here ({label})",
            )
            continue
        comm_name: str = comm  # narrowed here: a default argument below must not see None
        ctx.use_runtime()
        pconv = ctx.spell.links("ParallelConvolution2D")
        # Output channels are what is divided: with fewer of them than ranks, some ranks would
        # hold nothing and only wait (the design said in_channels; the split is over outputs).
        cond = ctx.code(out_channels)
        if not isinstance(
            out_channels, (cst.Name, cst.Attribute, cst.Integer, cst.BinaryOperation, cst.Call)
        ):
            cond = f"({cond})"  # binds looser than >=

        def fn(
            node: cst.CSTNode, cond: str = cond, comm: str = comm_name, pconv: str = pconv
        ) -> cst.CSTNode:
            assert isinstance(node, cst.Call)
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            split = node.with_changes(
                func=expression(pconv),
                args=[cst.Arg(expression(comm), comma=comma), *node.args],
            )
            return _laid_out(split, expression(f"{cond} >= {comm}.size"), node)

        ctx.plan.replace_node(call.node, fn, call.stmt)
        split += 1
        ctx.note(
            call.node,
            "model-parallel",
            "changed",
            f"split over ranks when {cond} >= {comm}.size (each rank owns a slice of the "
            f"output channels), else kept whole ({label})",
        )
    if split:
        _check_replicas(ctx)


def _plan_spatial(ctx: FileContext) -> None:
    """Ask for the model classes holding convolutions to be wrapped where they are built."""
    lifted = False
    for call in ctx.facts.calls:
        if not vocab.is_link(call.qname, "Convolution2D"):
            continue
        if ctx.suppressed(call.node, "model-parallel"):
            continue
        label = ctx.code(call.node)
        if ctx.options.target == "chainermn":
            ctx.note(
                call.node,
                "model-parallel",
                "needs-person",
                f"not split: ChainerMN has no spatial parallelism ({label})",
            )
            continue
        if ctx.lift(call.func, "spatial-parallel", "convolutions", call.node):
            lifted = True
            ctx.note(
                call.node,
                "model-parallel",
                "info",
                f"split into slabs of rows where its model is built ({label})",
            )
            continue
        ctx.note(
            call.node,
            "model-parallel",
            "needs-person",
            "not split: built outside a model class; wrap the model holding it with "
            f"create_spatial_parallel_model(model, comm) ({label})",
        )
    if lifted:
        ctx.note(
            None,
            "model-parallel",
            "info",
            "memory per rank: activations and their gradients are about 1/comm.size of one "
            "process's (each rank holds a slab of rows, plus a halo of a few rows per window "
            "layer); parameters, their gradients, the optimizer state and the input batch are "
            "whole on every rank. Flattening a feature map into a Linear layer mixes rows and "
            "is refused at the first call: end the convolutions with a global pooling",
        )
        _check_replicas(ctx)


def _line_break(extra: str) -> cst.ParenthesizedWhitespace:
    """A newline, then the enclosing block's indentation plus ``extra``."""
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), indent=True, last_line=cst.SimpleWhitespace(extra)
    )


def _laid_out(
    body: cst.BaseExpression, test: cst.BaseExpression, orelse: cst.BaseExpression
) -> cst.IfExp:
    """``(body if test else orelse)`` over three lines in parentheses, as black lays it out."""
    step = "    "
    return cst.IfExp(
        test=test,
        body=body,
        orelse=orelse,
        whitespace_before_if=_line_break(step),
        whitespace_before_else=_line_break(step),
        lpar=[cst.LeftParen(whitespace_after=_line_break(step))],
        rpar=[cst.RightParen(whitespace_before=_line_break(""))],
    )


def _check_replicas(ctx: FileContext) -> None:
    """Layers that are not split are replicated; the communicator rewrite hands rank 0's random
    state to every rank right after creating the communicator, so they start equal."""
    if ctx.entry is None or not ctx.comm_needed:
        return
    ctx.note(
        None,
        "model-parallel",
        "info",
        "replicated (unsplit) layers and the slices of split ones start equal on every rank: "
        "rank 0's numpy random state is given to all ranks after the communicator is created",
    )


def _plan_iterators(ctx: FileContext) -> None:
    wrap = ctx.spell.iterators("create_multi_node_iterator")
    for call in iterator_calls(ctx):
        if ctx.suppressed(call.node, "model-parallel"):
            continue
        comm = ctx.comm_at(call.func, "iterator")
        if comm is None:
            ctx.note(call.node, "model-parallel", "needs-person", f"wrap this iterator with {wrap}")
            continue
        ctx.use_runtime()
        ctx.plan.replace_node(call.node, wrap_call(wrap, comm), call.stmt)
        ctx.note(
            call.node,
            "model-parallel",
            "changed",
            f"iterator -> {wrap}(..., comm): rank 0 reads, every rank gets the same batch",
        )
