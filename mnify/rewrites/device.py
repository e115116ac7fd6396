"""DESIGN.md section 1, step "device": every rank drives the GPU numbered ``comm.intra_rank``.

When the device comes from the script's own argument (``--gpu 0`` or ``--device @cupy:0``) the
communicator rewrite re-points that argument to ``comm.intra_rank`` right after creating the
communicator, so every idiom downstream (``chainer.get_device(args.device)``,
``cuda.get_device_from_id(args.gpu).use()``, ``cuda.get_device(args.gpu).use()``,
``model.to_gpu(args.gpu)``, ``device=args.gpu``) follows without being touched. This module
handles the rest: literal GPU ids become ``comm.intra_rank``, a bare ``to_gpu()`` with no device
made current gets the rank's GPU, and an idiom it cannot trace is reported, not guessed at.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.facts import CallFact, names_in
from mnify.rewrites.registry import rewrite


def _device_arg(call: CallFact) -> cst.Arg | None:
    for arg in call.node.args:
        if arg.keyword is not None and arg.keyword.value in ("device", "device_id"):
            return arg
    positional = [a for a in call.node.args if a.keyword is None and not a.star]
    return positional[0] if positional else None


def _literal_gpu(expr: cst.BaseExpression) -> str | None:
    """'int' or 'str' for a literal naming a GPU (``0``, ``'0'``, ``'@cupy:1'``), else None."""
    if isinstance(expr, cst.Integer):
        return "int"
    if isinstance(expr, cst.SimpleString):
        text = str(expr.evaluated_value)
        if text.isdigit() or text.startswith("@cupy") or text.startswith("cuda"):
            return "str"
    return None


def _traced(ctx: FileContext, expr: cst.BaseExpression, depth: int = 0) -> bool:
    """True when the device expression derives from the script's device argument or comm."""
    entry = ctx.entry
    code = ctx.code(expr)
    if "intra_rank" in code:
        return True
    if entry is not None and entry.args and entry.device_dest:
        if f"{entry.args}.{entry.device_dest}" in code:
            return True
    if isinstance(expr, cst.UnaryOperation) or (
        isinstance(expr, cst.SimpleString) and not _literal_gpu(expr)
    ):
        return True  # -1, '@numpy', '-1': CPU
    if depth > 3:
        return False
    for name in names_in([expr]):
        for a in ctx.facts.assigns_of(name):
            if a.value is not None and _traced(ctx, a.value, depth + 1):
                return True
    return False


def _check_multi_gpu_updaters(ctx: FileContext) -> None:
    """Single-node multi-GPU updaters drive several GPUs from one process: under MPI each rank
    drives one, so they become a StandardUpdater on the rank's GPU (a person decides)."""
    for call in ctx.facts.calls:
        if vocab.is_multi_gpu_updater(call.qname):
            ctx.note(
                call.node,
                "device",
                "needs-person",
                f"{vocab.last(call.qname)} drives several GPUs from one process: with one rank "
                "per GPU use StandardUpdater(..., device=comm.intra_rank) instead",
            )


@rewrite("device", order=10, fixes=("MN103",), code="MN802")
def plan(ctx: FileContext) -> None:
    _check_multi_gpu_updaters(ctx)
    facts = ctx.facts
    has_use = any(c.method == "use" for c in facts.calls)
    for call in facts.calls:
        is_device_fn = call.qname in vocab.DEVICE_GETTERS
        is_move = call.method in ("to_gpu", "to_device") and not is_device_fn
        keyword_device = next(
            (
                a
                for a in call.node.args
                if a.keyword is not None and a.keyword.value == "device" and not is_device_fn
            ),
            None,
        )
        if not (is_device_fn or is_move or keyword_device is not None):
            continue
        if ctx.suppressed(call.node, "device"):
            continue
        arg = keyword_device if keyword_device is not None else _device_arg(call)
        if arg is None:
            if call.method == "to_gpu" and not has_use:
                comm = ctx.comm_at(call.func, "to_gpu()")
                if comm is None:
                    ctx.note(
                        call.node,
                        "device",
                        "needs-person",
                        "to_gpu() without a device puts every rank on GPU 0: pass comm.intra_rank",
                    )
                    continue
                ctx.plan.replace_node(call.node, _with_first_arg(f"{comm}.intra_rank"), call.stmt)
                ctx.note(call.node, "device", "changed", "to_gpu() -> to_gpu(comm.intra_rank)")
            continue
        given = arg.value
        if isinstance(given, cst.Attribute) and given.attr.value == "rank":
            # the global rank numbers GPUs across nodes; each node's GPUs start at 0 (MN103)
            receiver = ctx.code(given.value)
            ctx.plan.replace_node(arg, _with_value(f"{receiver}.intra_rank"), call.stmt)
            ctx.note(
                call.node,
                "device",
                "changed",
                f"GPU id {receiver}.rank (global) -> {receiver}.intra_rank (within the node)",
            )
            continue
        kind = _literal_gpu(arg.value)
        if kind is not None:
            comm = ctx.comm_at(call.func, "device literal")
            if comm is None:
                ctx.note(
                    call.node,
                    "device",
                    "needs-person",
                    f"literal GPU {ctx.code(arg.value)} here cannot see the communicator: "
                    "use comm.intra_rank",
                )
                continue
            value = (
                f"{comm}.intra_rank"
                if kind == "int"
                else f"{ctx.q('@cupy:%d')} % {comm}.intra_rank"
            )
            ctx.plan.replace_node(arg, _with_value(value), call.stmt)
            ctx.note(
                call.node,
                "device",
                "changed",
                f"literal GPU {ctx.code(arg.value)} -> {comm}.intra_rank",
            )
            continue
        if not _traced(ctx, arg.value):
            ctx.note(
                call.node,
                "device",
                "needs-person",
                f"device idiom not understood ({ctx.code(call.node)}): each rank must use "
                "GPU comm.intra_rank; check it by hand",
            )


def _with_value(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Arg)
        return node.with_changes(value=expression(value))

    return fn


def _with_first_arg(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        return node.with_changes(args=[cst.Arg(expression(value)), *node.args])

    return fn
