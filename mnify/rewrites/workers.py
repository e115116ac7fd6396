"""docs/design.md §1, step "workers": ranks on one node share its cores.

Every rank builds its own ``MultiprocessIterator``, so a script that asked for ``k`` loader
processes (``n_processes=args.loaderjob``) now starts ``k`` per rank: ``comm.intra_size`` times
``k`` on each node. The rewrite divides the workers by the ranks on the node, keeping at least
one: ``n_processes=max(1, args.loaderjob // comm.intra_size)``. Without ``n_processes`` Chainer
starts one worker per CPU on every rank, so the node's CPUs are divided the same way. Both
targets have ``comm.intra_size`` (ChainerMN 7.8.1's communicators too).
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites import global_data
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.registry import rewrite

_STEP = "workers"
# MultiprocessIterator(dataset, batch_size, repeat, shuffle, n_processes, ...)
_N_PROCESSES_POSITION = 4


def n_processes_arg(call: cst.Call) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "n_processes":
            return arg
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if any(a.star for a in call.args):
        return None
    return positional[_N_PROCESSES_POSITION] if len(positional) > _N_PROCESSES_POSITION else None


@rewrite(_STEP, order=55, code="MN812")
def plan(ctx: FileContext) -> None:
    for call in ctx.facts.calls:
        if not vocab.is_multiprocess_iterator(call.qname) or call.stmt is None:
            continue
        if global_data.replaces(ctx, call):
            continue  # --data global: the global-batch iterator has no workers
        arg = n_processes_arg(call.node)
        if arg is not None and "intra_size" in ctx.code(arg.value):
            continue  # divided before
        if any(a.star for a in call.node.args) or ctx.suppressed(call.node, _STEP):
            continue
        if not ctx.visible(call.func):
            ctx.note(
                call.node,
                _STEP,
                "needs-person",
                "MultiprocessIterator built where the communicator is not visible: every rank "
                "starts its own workers; divide n_processes by comm.intra_size by hand",
            )
            continue
        comm = ctx.comm_at(call.func, "MultiprocessIterator workers")
        if comm is None:
            continue
        given = arg is not None and not (
            isinstance(arg.value, cst.Name) and arg.value.value == "None"
        )
        if arg is not None and given:
            code = ctx.code(arg.value)
            simple = isinstance(arg.value, (cst.Name, cst.Attribute, cst.Integer, cst.Subscript))
            operand = code if simple else f"({code})"
            value = f"max(1, {operand} // {comm}.intra_size)"
            ctx.plan.replace_node(arg, _arg_value(value), call.stmt)
            if _too_long(ctx, call.node, arg, value, call.stmt):
                ctx.plan.replace_node(call.node, _break_before(arg), call.stmt)
            ctx.note(
                call.node,
                _STEP,
                "changed",
                f"n_processes = {value}: the ranks on a node share its cores",
            )
            continue
        mp = ctx.facts.local_name_of("multiprocessing")
        if mp is None:
            ctx.imports_needed.add("import multiprocessing")
            mp = "multiprocessing"
        value = f"max(1, {mp}.cpu_count() // {comm}.intra_size)"
        if arg is not None:
            ctx.plan.replace_node(arg, _arg_value(value), call.stmt)
        else:
            ctx.plan.replace_node(call.node, _add_keyword("n_processes", value), call.stmt)
        ctx.note(
            call.node,
            _STEP,
            "changed",
            f"n_processes = {value}: without it every rank would start one worker per CPU",
        )


_WIDTH = 79


def _too_long(
    ctx: FileContext, call: cst.Call, arg: cst.Arg, value: str, stmt: cst.BaseStatement
) -> bool:
    """Whether the continuation line holding ``arg`` grows past 79 columns (only for calls
    already laid out over several lines, whose continuation indent is known)."""
    if not isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        return False
    old = ctx.code(arg.value)
    lines = ctx.code(call).split("\n")
    depth = 0
    parent = ctx.facts.parent_statement(stmt)
    while parent is not None:
        depth += 1
        parent = ctx.facts.parent_statement(parent)
    for line in lines[1:]:
        if f"n_processes={old}" in line or (arg.keyword is None and old in line):
            if line.strip().startswith(("n_processes=", old)):
                return False  # already first on its line
            return 4 * depth + len(line) - len(old) + len(value) > _WIDTH
    return False


def _break_before(arg: cst.Arg) -> NodeFn:
    """Start ``arg`` on a new line, indented as the call's first continuation line."""

    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        args = list(node.args)
        index = next(
            (
                i
                for i, a in enumerate(args)
                if a.keyword is not None and a.keyword.value == "n_processes"
            ),
            None,
        )
        if index is None or index == 0:
            return node
        prev = args[index - 1]
        if not isinstance(prev.comma, cst.Comma):
            return node
        args[index - 1] = prev.with_changes(
            comma=prev.comma.with_changes(whitespace_after=node.whitespace_before_args)
        )
        return node.with_changes(args=args)

    return fn


def _arg_value(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Arg)
        return node.with_changes(value=expression(value))

    return fn


def _add_keyword(name: str, value: str) -> NodeFn:
    """Append ``name=value`` to a call, keeping a trailing comma and a one-per-line layout."""

    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        args = list(node.args)
        new = cst.Arg(
            value=expression(value),
            keyword=cst.Name(name),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
        if args:
            last = args[-1]
            previous = args[-2].comma if len(args) > 1 else cst.MaybeSentinel.DEFAULT
            after: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace(" ")
            if isinstance(previous, cst.Comma) and isinstance(
                previous.whitespace_after, cst.ParenthesizedWhitespace
            ):
                after = previous.whitespace_after  # one argument per line: stay so
            if isinstance(last.comma, cst.Comma):  # a trailing comma stays last
                new = new.with_changes(comma=last.comma)
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=after))
        args.append(new)
        return node.with_changes(args=args)

    return fn
