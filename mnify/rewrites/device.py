"""docs/design.md §1, step "device": every rank drives the GPU numbered ``comm.intra_rank``.

The script's own device flag decides at run time whether a run uses a GPU: ``--gpu 0`` /
``-g`` / ``--gpu-device`` / ``--gpu_id`` (an int, ``-1`` for CPU), ``--device @cupy:0`` (a
Chainer 7 device specifier), ``--gpus 0 1`` (a list; ``nargs``, ``action='append'``), ``--gpus
0,1`` (a comma string), ``--gpu`` alone (``store_true``). :func:`find_flag` reads which one the
script has and what its value looks like; :func:`gpu_test` is the run-time expression that is
true when the value selects a GPU (the communicator rewrite chooses ``pure_nccl`` or the CPU
communicator with it) and :func:`remap` re-points the flag to the rank's own GPU,
``comm.intra_rank``, right after the communicator exists: a list becomes ``[comm.intra_rank]``,
a specifier ``'@cupy:%d' % comm.intra_rank``. Every idiom downstream
(``chainer.get_device(args.device)``, ``cuda.get_device_from_id(args.gpus[0]).use()``,
``model.to_gpu(args.gpu)``, ``device=args.gpu_device``) then follows without being touched.

This module's rewrite handles the rest: literal GPU ids become ``comm.intra_rank``, a bare
``to_gpu()`` with no device made current gets the rank's GPU, a multi-GPU updater is checked
against the one GPU each rank now has, and an idiom it cannot trace is reported, not guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.registry import rewrite
from mnify.syntax import names_in

# What a device flag's value looks like at run time:
#   int       an int GPU id, negative for CPU (``type=int``)
#   untyped   an int default but no ``type=``: a str when given on the command line
#   spec      a str: a Chainer device specifier (``'@cupy:0'``, ``'-1'``, ``'@numpy'``, ``'0'``)
#   csv       a str of comma-separated GPU ids (``'0,1'``; the script splits it)
#   flag      a bool (``store_true``/``store_false``)
#   int_list, untyped_list, str_list   a list of the above (``nargs``, ``action='append'``)
Style = Literal["int", "untyped", "spec", "csv", "flag", "int_list", "untyped_list", "str_list"]
_LIST_STYLES = ("int_list", "untyped_list", "str_list")


@dataclass(frozen=True)
class DeviceFlag:
    """The script's device flag: its ``args`` attribute, how it is spelled, what it holds."""

    dest: str
    option: str  # '--gpus', as the script spells it (for the report)
    style: Style
    may_be_none: bool  # no default (or ``default=None``): None means no device was chosen

    @property
    def is_list(self) -> bool:
        return self.style in _LIST_STYLES


def _kwargs(call: cst.Call) -> dict[str, cst.BaseExpression]:
    return {a.keyword.value: a.value for a in call.args if a.keyword is not None}


def _text(expr: cst.BaseExpression | None) -> str | None:
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _options(call: cst.Call) -> list[str]:
    return [
        text
        for a in call.args
        if a.keyword is None and (text := _text(a.value)) is not None and text.startswith("-")
    ]


def flag_dest(call: cst.Call) -> str | None:
    """The namespace attribute an ``add_argument(...)`` call fills (``--gpu-device`` ->
    ``gpu_device``), as argparse derives it."""
    kw = _kwargs(call)
    if "dest" in kw:
        return _text(kw["dest"])
    options = _options(call)
    longs = [o for o in options if o.startswith("--")]
    pick = longs[0] if longs else (options[0] if options else "")
    return pick.lstrip("-").replace("-", "_") or None


def _is_int_literal(expr: cst.BaseExpression | None) -> bool:
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        expr = expr.expression
    return isinstance(expr, cst.Integer)


def _is_none(expr: cst.BaseExpression | None) -> bool:
    return expr is None or (isinstance(expr, cst.Name) and expr.value == "None")


def _element_kind(
    typ: cst.BaseExpression | None, sample: cst.BaseExpression | None
) -> Literal["int", "untyped", "str"] | None:
    """What one value of the flag is: from ``type=``, else from the default (or ``const``)."""
    if isinstance(typ, cst.Name):
        if typ.value == "int":
            return "int"
        if typ.value == "str":
            return "str"
        return None  # float, a converter function: not a device id we can read
    if typ is not None:
        return None
    if _is_int_literal(sample):
        return "untyped"
    return "str"


def _split_on(ctx: FileContext, dest: str) -> bool:
    """Whether the script splits the flag's value (``args.gpus.split(',')``): a comma string."""
    for call in ctx.facts.calls:
        func = call.node.func
        if call.method == "split" and isinstance(func, cst.Attribute):
            owner = func.value
            if isinstance(owner, cst.Attribute) and owner.attr.value == dest:
                return True
    return False


def analyse_flag(ctx: FileContext, call: cst.Call, dest: str) -> DeviceFlag | None:
    """What the flag ``add_argument(...)`` defines holds at run time (None: not readable)."""
    kw = _kwargs(call)
    options = _options(call)
    option = next((o for o in options if o.startswith("--")), options[0] if options else dest)
    action = _text(kw.get("action"))
    nargs = kw.get("nargs")
    default = kw.get("default")
    if action in ("store_true", "store_false"):
        return DeviceFlag(dest, option, "flag", False)
    if action not in (None, "store", "append"):
        return None
    listed = action == "append" or (
        nargs is not None and (_text(nargs) in ("*", "+") or isinstance(nargs, cst.Integer))
    )
    if listed:
        sample = None
        if isinstance(default, (cst.List, cst.Tuple)) and default.elements:
            sample = default.elements[0].value
        kind = _element_kind(kw.get("type"), sample)
        if kind is None:
            return None
        styles: dict[str, Style] = {"int": "int_list", "untyped": "untyped_list", "str": "str_list"}
        return DeviceFlag(dest, option, styles[kind], False)
    if nargs is not None and _text(nargs) != "?":
        return None
    sample = default if not _is_none(default) else kw.get("const")
    kind = _element_kind(kw.get("type"), sample)
    if kind is None:
        return None
    may_be_none = _is_none(default)
    if kind == "str":
        return DeviceFlag(dest, option, "csv" if _split_on(ctx, dest) else "spec", may_be_none)
    return DeviceFlag(dest, option, kind, may_be_none)


def device_expressions(ctx: FileContext) -> list[cst.BaseExpression]:
    """Expressions the script passes as a device, in source order."""
    found: list[cst.BaseExpression] = []
    for call in ctx.facts.calls:
        getter = call.qname in vocab.DEVICE_GETTERS or call.qname in vocab.DEVICE_SETTERS
        for arg in call.node.args:
            if arg.keyword is not None and arg.keyword.value in ("device", "device_id"):
                found.append(arg.value)
        if getter or call.method in ("to_gpu", "to_device"):
            positional = [a for a in call.node.args if a.keyword is None and not a.star]
            if positional:
                found.append(positional[0].value)
    return found


def _attribute_read(ctx: FileContext, expr: cst.BaseExpression, depth: int = 0) -> str | None:
    """``args.gpu`` / ``args.gpus[0]`` -> the attribute; a local bound to one is followed."""
    while isinstance(expr, cst.Subscript):
        expr = expr.value
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
        return expr.attr.value
    if isinstance(expr, cst.Name) and depth < 2:
        for a in ctx.facts.assigns_of(expr.value):
            if a.value is not None and len(a.targets) == 1:
                found = _attribute_read(ctx, a.value, depth + 1)
                if found is not None:
                    return found
    return None


def find_flag(ctx: FileContext) -> DeviceFlag | None:
    """The script's device flag: one whose value it passes as a device, else one with a device
    flag's name (``vocab.DEVICE_FLAG_DESTS``); None when it has none, or one we cannot read."""
    defined: dict[str, cst.Call] = {}
    for call in ctx.facts.calls:
        if call.method == "add_argument":
            dest = flag_dest(call.node)
            if dest is not None and dest not in defined:
                defined[dest] = call.node
    if not defined:
        return None
    used = [_attribute_read(ctx, e) for e in device_expressions(ctx)]
    for dest in [*(u for u in used if u is not None), *vocab.DEVICE_FLAG_DESTS]:
        if dest in defined:
            return analyse_flag(ctx, defined[dest], dest)
    return None


def chainer_name(ctx: FileContext) -> str:
    """How the file names the ``chainer`` package (imported when it does not)."""
    local = ctx.facts.local_name_of("chainer")
    if local is None:
        ctx.imports_needed.add("import chainer")
        return "chainer"
    return local


def _is_gpu_spec(ctx: FileContext, value: str) -> str:
    chainer = chainer_name(ctx)
    return f"isinstance({chainer}.get_device({value}), {chainer}.backend.GpuDevice)"


def gpu_test(ctx: FileContext, flag: DeviceFlag, args: str) -> str:
    """A run-time expression, true when the flag's value selects a GPU (``args.gpus and
    args.gpus[0] >= 0``)."""
    value = f"{args}.{flag.dest}"
    style = flag.style
    if style == "flag":
        return value
    if style == "int_list":
        return f"{value} and {value}[0] >= 0"
    if style == "untyped_list":
        return f"{value} and int({value}[0]) >= 0"
    if style == "str_list":
        return f"{value} and {_is_gpu_spec(ctx, f'{value}[0]')}"
    if style == "int":
        test = f"{value} >= 0"
    elif style == "untyped":
        test = f"int({value}) >= 0"
    elif style == "csv":
        test = f"int({value}.split({ctx.q(',')})[0]) >= 0"
    else:
        test = _is_gpu_spec(ctx, value)
    return f"{value} is not None and {test}" if flag.may_be_none else test


def remap(ctx: FileContext, flag: DeviceFlag, args: str, comm: str) -> str:
    """What runs when the flag selects a GPU: the flag re-pointed to the rank's own GPU
    (``args.gpus = [comm.intra_rank]``), or for a bare on/off flag the rank's GPU made current."""
    rank = f"{comm}.intra_rank"
    target = f"{args}.{flag.dest}"
    style = flag.style
    if style == "flag":
        return f"{chainer_name(ctx)}.backends.cuda.get_device_from_id({rank}).use()"
    if style in ("int", "untyped"):
        return f"{target} = {rank}"
    if style in ("int_list", "untyped_list"):
        return f"{target} = [{rank}]"
    if style == "str_list":
        return f"{target} = [str({rank})]"
    if style == "csv" or not flag.dest.startswith("device"):
        return f"{target} = str({rank})"  # '--gpu 0' spelled as a string: keep it a number
    return f"{target} = {ctx.q(vocab.CUPY_DEVICE_SPEC)} % {rank}"


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


def _parameters(ctx: FileContext, func: cst.FunctionDef | None) -> set[str]:
    """Parameter names of ``func`` and of the functions around it (but not one whose default
    names a GPU: callers that leave it out all use that GPU)."""
    names: set[str] = set()
    scope: object = func
    while isinstance(scope, cst.FunctionDef):
        params = scope.params
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            if p.default is None or _literal_gpu(p.default) is None:  # not `device=0`
                names.add(p.name.value)
        scope = ctx.facts.func_parent.get(id(scope))
    return names


def _traced(
    ctx: FileContext,
    expr: cst.BaseExpression,
    depth: int = 0,
    func: cst.FunctionDef | None = None,
) -> bool:
    """True when the device expression derives from the script's device argument or comm, or
    is a parameter of the function it is used in (its callers pass the device; their device
    arguments are checked where they are)."""
    entry = ctx.entry
    if isinstance(expr, cst.Name) and expr.value in _parameters(ctx, func):
        return True
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


def _len_test_result(test: cst.BaseExpression, value: str, ctx: FileContext, n: int) -> bool | None:
    """``len(args.gpus) > 1`` evaluated for a list of ``n`` (None: not a test of that form)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    left, target = test.left, test.comparisons[0]
    if not (
        isinstance(left, cst.Call)
        and isinstance(left.func, cst.Name)
        and left.func.value == "len"
        and len(left.args) == 1
        and ctx.code(left.args[0].value) == value
        and isinstance(target.comparator, cst.Integer)
    ):
        return None
    k = int(target.comparator.value)
    compare = {
        cst.GreaterThan: n > k,
        cst.GreaterThanEqual: n >= k,
        cst.LessThan: n < k,
        cst.LessThanEqual: n <= k,
        cst.Equal: n == k,
        cst.NotEqual: n != k,
    }
    return compare.get(type(target.operator))


def _reached_with_one_gpu(ctx: FileContext, call: CallFact) -> bool | None:
    """Whether the multi-GPU updater ``call`` still runs once each rank's list flag holds one
    GPU: the nearest enclosing ``if`` testing ``len(args.gpus)`` decides (None: no such if)."""
    entry = ctx.entry
    flag = find_flag(ctx)
    if entry is None or entry.args is None or flag is None or not flag.is_list:
        return None
    value = f"{entry.args}.{flag.dest}"
    inner: cst.CSTNode | None = call.stmt
    holder = ctx.facts.parent_statement(call.stmt) if call.stmt is not None else None
    while holder is not None and inner is not None:
        if isinstance(holder, cst.If):
            taken = _len_test_result(holder.test, value, ctx, 1)
            if taken is not None:
                in_body = any(s is inner for s in holder.body.body)
                return taken if in_body else not taken
        inner, holder = holder, ctx.facts.parent_statement(holder)
    return None


def _check_multi_gpu_updaters(ctx: FileContext) -> None:
    """Single-node multi-GPU updaters drive several GPUs from one process: under MPI each rank
    drives one. Behind ``if len(args.gpus) > 1:`` they are no longer reached (each rank's list
    now holds its own GPU); anywhere else a person decides."""
    for call in ctx.facts.calls:
        if not vocab.is_multi_gpu_updater(call.qname):
            continue
        name = vocab.last(call.qname)
        if _reached_with_one_gpu(ctx, call) is False:
            ctx.note(
                call.node,
                "device",
                "info",
                f"{name} is not reached any more: each rank's device list holds one GPU "
                "(comm.intra_rank), so the single-GPU branch runs on every rank",
            )
            continue
        ctx.note(
            call.node,
            "device",
            "needs-person",
            f"{name} drives several GPUs from one process: with one rank "
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
        if not _traced(ctx, arg.value, func=call.func):
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
