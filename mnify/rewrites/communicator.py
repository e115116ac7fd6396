"""DESIGN.md section 1, step "communicator": ``comm = mn.create_communicator(...)``.

Finds the training entry point (right after ``args = parser.parse_args()``, else the top of
``main()``, else module level after the imports) and, once the other rewrites have said they need
a communicator there, inserts its creation. The communicator name is chosen at run time from
the script's own device argument when only the run knows whether it uses a GPU: CPU runs get
``naive`` (the CPU communicator), GPU runs ``pure_nccl``, unless ``--communicator`` says
otherwise. The device rewrite's remap statement and the forkserver preamble are placed here too,
because their order relative to the communicator matters.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites.context import Entry, FileContext
from mnify.rewrites.edits import statement
from mnify.rewrites.facts import CallFact
from mnify.rewrites.registry import rewrite


def _dest(call: cst.Call) -> str | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "dest":
            if isinstance(arg.value, cst.SimpleString):
                return str(arg.value.evaluated_value)
            return None
    options = [
        str(a.value.evaluated_value)
        for a in call.args
        if a.keyword is None and isinstance(a.value, cst.SimpleString)
    ]
    longs = [o for o in options if o.startswith("--")]
    pick = longs[0] if longs else (options[0] if options else "")
    return pick.lstrip("-").replace("-", "_") or None


def _style(call: cst.Call) -> str:
    kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    action = kw.get("action")
    if isinstance(action, cst.SimpleString) and "store_" in str(action.evaluated_value):
        return "flag"
    typ = kw.get("type")
    if isinstance(typ, cst.Name):
        return "int" if typ.value == "int" else "str"
    default = kw.get("default")
    if isinstance(default, cst.SimpleString):
        return "str"
    return "int"


DEVICE_DESTS = ("gpu", "device", "gpu_id", "gpuid")


@rewrite("communicator", order=0, code="MN801")
def find_entry(ctx: FileContext) -> None:
    """Decide where the communicator lives; reads facts only."""
    facts = ctx.facts
    for a in facts.assigns:
        if isinstance(a.value, cst.Call) and len(a.targets) == 1:
            q = getattr(facts.call_of(a.value), "qname", "")
            if vocab.is_communicator_factory(q):
                ctx.entry = Entry(func=a.func, comm=a.targets[0], exists=True, creation=a.stmt)
                break
    entry = ctx.entry
    if entry is None:
        entry = _entry_from_parse_args(ctx)
    if entry is None:
        main = facts.module_functions.get("main")
        if main is not None:
            entry = Entry(func=main, top_of=main)
        elif _module_level_training(ctx):
            anchor = facts.imports[-1] if facts.imports else None
            entry = Entry(func=None, anchor=anchor)
    if entry is None:
        return
    ctx.entry = entry
    if entry.args is None:
        for a in facts.assigns:
            if isinstance(a.value, cst.Call) and len(a.targets) == 1:
                call = facts.call_of(a.value)
                if call is not None and call.method == "parse_args":
                    entry.args = a.targets[0]
    for call in facts.calls:
        if call.method == "add_argument":
            dest = _dest(call.node)
            if dest in DEVICE_DESTS and entry.device_dest is None:
                entry.device_dest = dest
                entry.device_style = _style(call.node)


def _entry_from_parse_args(ctx: FileContext) -> Entry | None:
    facts = ctx.facts
    for call in facts.calls:
        if call.method != "parse_args":
            continue
        stmt = call.stmt
        if stmt is None:
            continue
        target = _assigned_name(ctx, call.node)
        if target is not None:
            block = facts.block_of.get(id(stmt))
            if block is not None and block.func is call.func:
                return Entry(func=call.func, anchor=stmt, args=target)
            if call.func is not None:
                return Entry(func=call.func, top_of=call.func, args=target)
        passed = _passed_to_function(ctx, call)
        if passed is not None:
            return passed
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Return):
            helper = call.func
            if helper is None:
                continue
            for site in facts.calls:
                if site.qname == helper.name.value and site.stmt is not None:
                    name = _assigned_name(ctx, site.node)
                    block = facts.block_of.get(id(site.stmt))
                    if name and block is not None and block.func is site.func:
                        return Entry(func=site.func, anchor=site.stmt, args=name)
    return None


def _passed_to_function(ctx: FileContext, call: CallFact) -> Entry | None:
    """``main(parser.parse_args())``: the entry is ``main``, the namespace its parameter."""
    parent = ctx.facts.call_of(call.parent_call)
    if parent is None:
        return None
    func = ctx.facts.module_functions.get(parent.qname)
    if func is None:
        return None
    positional = [a for a in parent.node.args if a.keyword is None]
    for arg in parent.node.args:
        if arg.value is call.node:
            if arg.keyword is not None:
                name = arg.keyword.value
            else:
                index = positional.index(arg)
                params = func.params.params
                if index >= len(params):
                    return None
                name = params[index].name.value
            return Entry(func=func, top_of=func, args=name)
    return None


def _assigned_name(ctx: FileContext, value: cst.Call) -> str | None:
    for a in ctx.facts.assigns:
        if a.value is value and len(a.targets) == 1:
            return a.targets[0]
    return None


def _module_level_training(ctx: FileContext) -> bool:
    return any(
        c.func is None
        and (vocab.is_optimizer(c.qname) or vocab.is_iterator(c.qname) or vocab.is_trainer(c.qname))
        for c in ctx.facts.calls
    )


def _chainer(ctx: FileContext) -> str:
    local = ctx.facts.local_name_of("chainer")
    if local is None:
        ctx.imports_needed.add("import chainer")
        return "chainer"
    return local


def gpu_test(ctx: FileContext) -> str | None:
    """A run-time expression that is true when the script runs on a GPU, from its own flag."""
    entry = ctx.entry
    if entry is None or entry.args is None or entry.device_dest is None:
        return None
    arg = f"{entry.args}.{entry.device_dest}"
    if entry.device_style == "int":
        return f"{arg} >= 0"
    if entry.device_style == "flag":
        return arg
    chainer = _chainer(ctx)
    return f"isinstance({chainer}.get_device({arg}), {chainer}.backend.GpuDevice)"


def uses_gpu_statically(ctx: FileContext) -> bool:
    return any(c.method in ("to_gpu",) or c.qname in vocab.DEVICE_GETTERS for c in ctx.facts.calls)


def creation_statements(ctx: FileContext) -> list[cst.BaseStatement]:
    """``comm = ...create_communicator(...)`` and the device remap that follows it."""
    entry = ctx.entry
    assert entry is not None
    create = ctx.runtime.top("create_communicator")
    test = gpu_test(ctx)
    if ctx.options.communicator != "auto":
        name_expr = ctx.q(ctx.options.communicator)
    elif test is not None:
        name_expr = f"{ctx.q('pure_nccl')} if {test} else {ctx.q('naive')}"
    elif uses_gpu_statically(ctx):
        name_expr = ctx.q("pure_nccl")
    else:
        name_expr = ctx.q("naive")
    line = f"{entry.comm} = {create}({name_expr})\n"
    if len(line) > 80:
        inner = f"    {name_expr}\n"
        if len(inner) > 80 and test is not None:
            gpu, cpu = ctx.q("pure_nccl"), ctx.q("naive")
            inner = f"    {gpu}\n    if {test}\n    else {cpu}\n"
        line = f"{entry.comm} = {create}(\n{inner})\n"
    out: list[cst.BaseStatement] = [statement(line)]
    if not ctx.options.data_parallel:
        out.append(statement(_same_initial_weights(ctx)))
    if test is not None:
        arg = f"{entry.args}.{entry.device_dest}"
        rank = f"{entry.comm}.intra_rank"
        value = rank if entry.device_style != "str" else f"{ctx.q('@cupy:%d')} % {rank}"
        if entry.device_style == "flag":
            value = "True"
        if entry.device_style != "flag":
            out.append(
                statement(
                    f"if {test}:\n"
                    "    # one GPU per rank, numbered within the node (intra_rank, not rank)\n"
                    f"    {arg} = {value}\n"
                )
            )
    return out


def _same_initial_weights(ctx: FileContext) -> str:
    """Model parallel: no optimizer broadcasts parameters, so every rank must draw the same
    initial weights (replicated layers, and the slices of each split convolution). Rank 0's
    numpy random state goes to every rank, which keeps a seed the user set earlier."""
    np_name = next((b for b, m in ctx.facts.imported_modules.items() if m == "numpy"), None)
    if np_name is None:
        ctx.imports_needed.add("import numpy")
        np_name = "numpy"
    comm = ctx.entry.comm if ctx.entry is not None else "comm"
    return (
        "# model parallel: every rank must build the same initial weights\n"
        f"{np_name}.random.set_state({comm}.bcast_obj({np_name}.random.get_state()))\n"
    )


def emit(ctx: FileContext, preamble: list[cst.BaseStatement]) -> None:
    """Insert the communicator (after the other rewrites decided they need it)."""
    entry = ctx.entry
    if entry is None or entry.exists or not ctx.comm_needed:
        return
    new = [*preamble, *creation_statements(ctx)]
    if entry.anchor is not None:
        if ctx.suppressed(entry.anchor, "communicator"):
            return
        ctx.plan.insert_after(entry.anchor, new)
        where: cst.CSTNode = entry.anchor
    elif entry.top_of is not None:
        body = entry.top_of.body
        assert isinstance(body, cst.IndentedBlock)
        stmts = list(body.body)
        first = 1 if stmts and _is_docstring(stmts[0]) and len(stmts) > 1 else 0
        ctx.plan.insert_before(stmts[first], new)
        where = stmts[first]
    else:
        stmts = list(ctx.module.body)
        first = 1 if stmts and _is_docstring(stmts[0]) and len(stmts) > 1 else 0
        ctx.plan.insert_before(stmts[first], new)
        where = stmts[first]
    ctx.note(where, "communicator", "changed", f"create the communicator ({entry.comm})")
    if entry.device_dest is not None and gpu_test(ctx) is not None:
        ctx.note(
            where,
            "device",
            "changed",
            f"GPU runs use GPU comm.intra_rank (set into {entry.args}.{entry.device_dest})",
        )


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
