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

Without a flag, the device the entry point reads in its own code decides the same way
(:func:`find_source`): a constant (``gpu = -1``), an entry of a config it loads
(``settings["gpu"]`` after ``settings = json.load(f)``, ``cfg.gpu`` of a parameter,
``config['device']``) or a variable set once from one (``gpu = int(cfg['gpu'])``). The
communicator is created right after the statement that sets it, and the entry itself is
re-pointed to the rank's GPU (``if settings["gpu"] >= 0: settings["gpu"] = comm.intra_rank``; a
device specifier becomes ``'@cupy:%d' % comm.intra_rank``), so every read of it follows.

This module's rewrite handles the rest: literal GPU ids become ``comm.intra_rank``, a bare
``to_gpu()`` with no device made current gets the rank's GPU, a multi-GPU updater is checked
against the one GPU each rank now has, and an idiom it cannot trace is reported, not guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.effect_summary import table_root
from mnify.program.facts import CallFact
from mnify.rewrites.context import Entry, FileContext
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


# ------------------------------------------------------------------ a device read in the code
SourceStyle = Literal["int", "untyped", "spec"]


@dataclass(frozen=True)
class DeviceSource:
    """A device the entry point reads in its own code instead of from a flag: an entry of a
    config it loads (``settings["gpu"]``, ``cfg.gpu``, ``config['device']``), a variable set
    from one (``gpu = int(cfg['gpu'])``) or a constant (``gpu = -1``). ``text`` is the
    expression as the script spells it (what the remap assigns to), ``path`` what it reads
    (:func:`read_path`), ``style`` what its value looks like (``int``: a GPU id, negative for
    CPU; ``untyped``: one the script reads with ``int()``; ``spec``: a Chainer device
    specifier), ``anchor`` the statement of the entry's block after which it is known (None:
    known before the entry runs: a parameter, a module-level name)."""

    text: str
    path: tuple[str, ...]
    style: SourceStyle
    anchor: cst.BaseStatement | None


def read_path(expr: cst.BaseExpression) -> tuple[str, ...] | None:
    """What ``expr`` reads, as a path from a name: ``settings["gpu"]`` -> ``("settings",
    "[gpu]")``, ``cfg.train.gpu`` -> ``("cfg", ".train", ".gpu")``, ``gpu`` -> ``("gpu",)``;
    None for anything else (a call, an index that is not a string literal)."""
    parts: list[str] = []
    while True:
        if isinstance(expr, cst.Name):
            return (expr.value, *reversed(parts))
        if isinstance(expr, cst.Attribute):
            parts.append("." + expr.attr.value)
            expr = expr.value
        elif (
            isinstance(expr, cst.Subscript)
            and len(expr.slice) == 1
            and isinstance(expr.slice[0].slice, cst.Index)
            and (key := _text(expr.slice[0].slice.value)) is not None
        ):
            parts.append(f"[{key}]")
            expr = expr.value
        else:
            return None


def _config_entry(ctx: FileContext, entry: Entry, expr: cst.BaseExpression) -> bool:
    """``json.load(f)['gpu']``, ``load_config(path).gpu``: an entry of something the script
    loads, named (a string key or an attribute; not a library module's attribute, nor the
    parsed arguments', whose flags ``find_flag`` reads)."""
    root: cst.BaseExpression = expr
    while isinstance(root, (cst.Attribute, cst.Subscript, cst.Call)):
        root = root.func if isinstance(root, cst.Call) else root.value
    if isinstance(root, cst.Name) and root.value == entry.args:
        return False
    if isinstance(expr, cst.Subscript):
        return (
            len(expr.slice) == 1
            and isinstance(expr.slice[0].slice, cst.Index)
            and _text(expr.slice[0].slice.value) is not None
        )
    if isinstance(expr, cst.Attribute):
        module = ctx.facts.imported_modules.get(root.value) if isinstance(root, cst.Name) else None
        return module is None or not table_root(module)
    return False


def _unwrap_int(expr: cst.BaseExpression) -> tuple[cst.BaseExpression, bool]:
    """``int(x)`` -> (x, True); anything else as it is."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Name)
        and expr.func.value == "int"
        and len(expr.args) == 1
        and expr.args[0].keyword is None
        and not expr.args[0].star
    ):
        return expr.args[0].value, True
    return expr, False


def _device_uses(
    ctx: FileContext, func: cst.FunctionDef | None
) -> list[tuple[CallFact, cst.BaseExpression]]:
    """The calls of ``func``'s own code (None: the module's) that take a device, with the
    expression each is given, in source order (see :func:`device_expressions`)."""
    found: list[tuple[CallFact, cst.BaseExpression]] = []
    for call in ctx.facts.calls:
        if call.func is not func:
            continue
        getter = call.qname in vocab.DEVICE_GETTERS or call.qname in vocab.DEVICE_SETTERS
        for arg in call.node.args:
            if arg.keyword is not None and arg.keyword.value in ("device", "device_id"):
                found.append((call, arg.value))
        if getter or call.method in ("to_gpu", "to_device"):
            positional = [a for a in call.node.args if a.keyword is None and not a.star]
            if positional:
                found.append((call, positional[0].value))
    return found


class _Reads(cst.CSTVisitor):
    """Whether a statement reads ``path`` (assignment targets, keywords and the names of
    attributes, parameters and definitions are not reads); and whether it compares what it
    reads with a number (``settings["gpu"] >= 0``: an int)."""

    def __init__(self, path: tuple[str, ...]) -> None:
        super().__init__()
        self.path = path
        self.found = False
        self.compared = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)):
            if read_path(node) == self.path:
                self.found = True
                return False
            if isinstance(node, cst.Attribute):
                node.value.visit(self)
                return False
        if isinstance(node, cst.Comparison):
            operands = [node.left, *(c.comparator for c in node.comparisons)]
            if any(read_path(_unwrap_int(o)[0]) == self.path for o in operands) and any(
                _is_int_literal(o) for o in operands
            ):
                self.compared = True
        if isinstance(node, cst.Assign):
            node.value.visit(self)
            return False
        if isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            if node.value is not None:
                node.value.visit(self)
            return False
        if isinstance(node, cst.Arg):
            node.value.visit(self)
            return False
        if isinstance(node, cst.Param):
            if node.default is not None:
                node.default.visit(self)
            return False
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            node.body.visit(self)
            return False
        if isinstance(node, (cst.AsName, cst.Import, cst.ImportFrom)):
            return False
        if isinstance(node, cst.For):
            for part in (node.iter, node.body, node.orelse):
                if part is not None:
                    part.visit(self)
            return False
        return super().on_visit(node)


def _reads(stmt: cst.CSTNode, path: tuple[str, ...]) -> _Reads:
    found = _Reads(path)
    stmt.visit(found)
    return found


def _entry_block(ctx: FileContext, entry: Entry) -> Sequence[cst.BaseStatement] | None:
    """The statements of the entry point's own block: its function's, its main guard's or the
    module's."""
    if entry.func is not None:
        body = entry.func.body
        return body.body if isinstance(body, cst.IndentedBlock) else None
    guard = getattr(entry, "guard", None)
    if isinstance(guard, cst.If) and isinstance(guard.body, cst.IndentedBlock):
        return guard.body.body
    return ctx.module.body


def _index_in(
    ctx: FileContext, block: Sequence[cst.BaseStatement], stmt: cst.BaseStatement
) -> int | None:
    """The index of the statement of ``block`` that is or holds ``stmt`` (None: outside)."""
    current: cst.BaseStatement | None = stmt
    while current is not None:
        for i, top in enumerate(block):
            if top is current:
                return i
        current = ctx.facts.parent_statement(current)
    return None


def _known_before(ctx: FileContext, entry: Entry, name: str) -> bool:
    """``name`` holds its value before the entry's own code runs: a parameter of the entry
    function, a module-level assignment, or an import of the project's (a ``config`` module;
    not a library's: ``os.environ`` is no config of the script's)."""
    func = entry.func
    if func is not None:
        params = func.params
        if any(
            p.name.value == name
            for p in (*params.posonly_params, *params.params, *params.kwonly_params)
        ):
            return True
        if any(a.func is None for a in ctx.facts.assigns_of(name)):
            return True
    module = ctx.facts.imported_modules.get(name)
    return module is not None and not table_root(module)


def find_source(ctx: FileContext, entry: Entry) -> DeviceSource | None:
    """Where a script without a device flag keeps its device (:class:`DeviceSource`): the
    first device the entry point's own code passes (``get_device_from_id(settings["gpu"])``,
    ``device=cfg.gpu``, ``to_gpu(gpu)`` with ``gpu = int(config['gpu'])``) that reads a config
    entry, or a variable set once from one, whose value is known at a statement of the entry's
    block before any of its reads. The config entry itself is preferred, so that every read of
    it picks the rank's GPU. None when there is no such place: the device idiom then needs a
    person (MN103)."""
    block = _entry_block(ctx, entry)
    if block is None:
        return None
    earliest = -1
    if entry.anchor is not None:
        at = _index_in(ctx, block, entry.anchor)
        if at is None:
            return None
        earliest = at
    uses = _device_uses(ctx, entry.func)
    for _call, given in uses:
        inner, wrapped = _unwrap_int(given)
        path = read_path(inner)
        if path is None:
            continue
        candidates: list[tuple[cst.BaseExpression, tuple[str, ...], bool]] = []
        if len(path) > 1:
            candidates.append((inner, path, wrapped))
        else:
            bound = [a for a in ctx.facts.assigns_of(path[0]) if a.func is entry.func]
            if len(bound) == 1 and bound[0].value is not None and bound[0].targets == path:
                value, value_wrapped = _unwrap_int(bound[0].value)
                read = read_path(value)
                if read is not None and len(read) > 1:
                    candidates.append((value, read, value_wrapped))
                if (read is not None and len(read) > 1) or _config_entry(ctx, entry, value):
                    candidates.append((inner, path, False))
        for expr, candidate, untyped in candidates:
            found = _placed(ctx, entry, block, earliest, expr, candidate, untyped, uses)
            if found is not None:
                return found
    return None


def _placed(
    ctx: FileContext,
    entry: Entry,
    block: Sequence[cst.BaseStatement],
    earliest: int,
    expr: cst.BaseExpression,
    path: tuple[str, ...],
    untyped: bool,
    uses: list[tuple[CallFact, cst.BaseExpression]],
) -> DeviceSource | None:
    """``path`` as the device source when a statement of ``block`` (at or after ``earliest``)
    binds what it reads and every read of it comes after that statement."""
    base = path[0]
    if base == entry.args or base in ("self", "cls"):
        return None
    bindings = [
        a for a in ctx.facts.assigns_of(base) if a.func is entry.func and a.stmt is not None
    ]
    where = [_index_in(ctx, block, a.stmt) for a in bindings if a.stmt is not None]
    if any(i is None for i in where) and entry.func is not None:
        return None
    inside = [i for i in where if i is not None]
    if not inside and not _known_before(ctx, entry, base):
        return None
    bound = max(inside, default=-1)
    anchor: cst.BaseStatement | None
    if bound > earliest:
        at, anchor = bound, block[bound]
    elif bound == earliest and entry.anchor is not None:
        return None  # bound where the arguments are parsed: no place in between
    else:
        at, anchor = earliest, entry.anchor
    reads = [i for i, stmt in enumerate(block) if _reads(stmt, path).found]
    if not reads or min(reads) <= at:
        return None
    return DeviceSource(
        ctx.code(expr), path, _style(ctx, entry, block, path, untyped, uses), anchor
    )


def _style(
    ctx: FileContext,
    entry: Entry,
    block: Sequence[cst.BaseStatement],
    path: tuple[str, ...],
    untyped: bool,
    uses: list[tuple[CallFact, cst.BaseExpression]],
) -> SourceStyle:
    """What the source's value looks like: read with ``int()`` (``untyped``), compared with a
    number (directly or through a variable set from it) or named like a GPU id (``int``), or
    named like a device and only given where Chainer takes any specifier (``spec``:
    ``chainer.get_device(x)``, ``device=x``, ``to_device(x)``)."""
    if untyped:
        return "untyped"
    aliases = [
        (a.targets[0],)
        for a in ctx.facts.assigns
        if a.func is entry.func
        and len(a.targets) == 1
        and a.value is not None
        and read_path(_unwrap_int(a.value)[0]) == path
    ]
    if any(_reads(stmt, p).compared for p in (path, *aliases) for stmt in block):
        return "int"
    if not path[-1].lstrip(".[").startswith("device"):
        return "int"
    id_only = any(
        read_path(_unwrap_int(given)[0]) in (path, *aliases)
        and call.qname not in vocab.SPEC_DEVICE_GETTERS
        and call.method != "to_device"
        and not _keyword_device(call, given)
        for call, given in uses
    )
    return "int" if id_only else "spec"


def _keyword_device(call: CallFact, given: cst.BaseExpression) -> bool:
    """``given`` is the ``device=`` argument of ``call`` (an updater's, an evaluator's)."""
    return any(
        a.keyword is not None and a.keyword.value in ("device", "device_id") and a.value is given
        for a in call.node.args
    )


def source_test(ctx: FileContext, source: DeviceSource) -> str:
    """A run-time expression, true when the source's value selects a GPU."""
    if source.style == "spec":
        return _is_gpu_spec(ctx, source.text)
    if source.style == "untyped":
        return f"int({source.text}) >= 0"
    return f"{source.text} >= 0"


def source_remap(ctx: FileContext, source: DeviceSource, comm: str) -> str:
    """The source re-pointed to the rank's own GPU (``settings["gpu"] = comm.intra_rank``)."""
    rank = f"{comm}.intra_rank"
    if source.style == "spec":
        return f"{source.text} = {ctx.q(vocab.CUPY_DEVICE_SPEC)} % {rank}"
    return f"{source.text} = {rank}"


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
    # a config entry the communicator's remap re-points (``settings["gpu"]``), or one the
    # script re-points itself (``cfg.gpu = comm.intra_rank``: converted before)
    sources = [entry.device_source.path] if entry is not None and entry.device_source else []
    if any(_reads(expr, path).found for path in [*sources, *_remapped_paths(ctx)]):
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


def _remapped_paths(ctx: FileContext) -> list[tuple[str, ...]]:
    """What the script assigns the rank's GPU to (``settings["gpu"] = comm.intra_rank``)."""
    found: list[tuple[str, ...]] = []
    for a in ctx.facts.assigns:
        if isinstance(a.node, cst.Assign) and "intra_rank" in names_in([a.node.value]):
            for target in a.node.targets:
                path = read_path(target.target)
                if path is not None and path not in found:
                    found.append(path)
    return found


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
