"""docs/design.md §1, step "communicator": ``comm = mn.create_communicator(...)``.

Where: in the training entry point, right after it obtains the parsed arguments. The namespace
is followed from ``parser.parse_args()`` to where the script keeps it: a helper that only parses
and returns it (``def get_args(): args = parser.parse_args(); return args``) is not a home,
its caller is (``args = get_args()`` in ``main``); ``main(parser.parse_args())`` and, at module
level, ``args = parser.parse_args(); main(args)`` make ``main`` the home, at its top. A module-level
script keeps the communicator (and the forkserver preamble the driver puts just before it) inside
``if __name__ == '__main__':`` when its training code is there, so processes that re-import the
script never create one. Without arguments: the top of ``main()``, else module level.

Which: decided at run time from what the script's own device flag selects (``device.find_flag``:
``--gpu``, ``-g``, ``--gpu-device``, ``--gpu_id``, ``--device``, a ``--gpus`` list, a comma
string, an on/off switch): GPU runs get ``pure_nccl``, CPU runs the CPU communicator (``flat``;
``naive`` under ``--target chainermn``, whose ``flat`` needs GPU memory). A script without such
a flag decides from the device its code sets (a constant, an entry of a config it loads:
``device.find_source``), the communicator then created right after the statement that sets it
(``with open(path) as f: settings = json.load(f)``); failing that, it gets ``pure_nccl`` when it
moves its model to a GPU, else the CPU one. ``--communicator`` overrides all of this. Right
after creation, the flag (or the device the code set) is re-pointed to the rank's own GPU
(``device.remap``, ``device.source_remap``). Both decisions, and why, go to the report.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites import device
from mnify.rewrites.context import Entry, FileContext
from mnify.rewrites.edits import statement
from mnify.rewrites.registry import rewrite

# argparse methods returning the namespace (``parse_known_args``: first of a pair)
_PARSE_METHODS = {"parse_args": None, "parse_known_args": 0}


@dataclass(eq=False)
class Home(Entry):
    """An :class:`Entry` with what this rewrite needs besides: the main guard whose top holds
    the communicator (module-level scripts whose ``args`` come from outside it), and why the
    communicator lives here, for the report."""

    guard: cst.If | None = None
    why: str = ""
    # where a module-level communicator goes instead of the main guard when statements before
    # the guard need it (the namespace's statement, or the last import)
    fallback: cst.BaseStatement | None = None


@rewrite("communicator", order=0, code="MN801")
def find_entry(ctx: FileContext) -> None:
    """Decide where the communicator lives and which device flag the script has; reads facts
    only (the communicator itself is inserted by :func:`emit`, once the rewrites said they
    need it)."""
    facts = ctx.facts
    home = _namespace_home(ctx)
    existing = _existing(ctx)
    entry: Entry | None = existing or home
    if existing is not None and home is not None:
        existing.args = home.args
    if entry is None:
        main = facts.module_functions.get("main")
        if main is not None:
            entry = Home(func=main, top_of=main)
        elif _module_level_training(ctx):
            guard = _main_guard(ctx)
            if guard is not None and _training_inside(ctx, guard):
                entry = Home(func=None, guard=guard, fallback=_last_import(ctx))
            else:
                entry = Home(func=None, anchor=facts.imports[-1] if facts.imports else None)
    if entry is None:
        return
    ctx.entry = entry
    flag = device.find_flag(ctx)
    if flag is not None and entry.args is not None:
        entry.device_dest = flag.dest
        entry.device_style = flag.style
    elif flag is None and not entry.exists:
        _device_constant(ctx, entry)
        if entry.device_source is None:
            source = device.find_source(ctx, entry)
            if source is not None:
                entry.device_source = source
                if source.anchor is not None:
                    entry.anchor, entry.top_of = source.anchor, None


def _device_constant(ctx: FileContext, entry: Entry) -> None:
    """``gpu = -1`` in the entry's own body, passed as a device (``device=gpu``,
    ``to_gpu(gpu)``, ``get_device_from_id(gpu)``): the communicator goes right after that
    assignment, so it can read the constant at run time. A device read from a config instead
    (``settings["gpu"]``, ``cfg.gpu``) is ``device.find_source``'s."""
    for expr in device.device_expressions(ctx):
        if not isinstance(expr, cst.Name):
            continue
        for a in ctx.facts.assigns_of(expr.value):
            if a.func is not entry.func or len(a.targets) != 1 or a.stmt is None:
                continue
            if not _is_int_constant(a.value):
                continue
            block = ctx.facts.block_of.get(id(a.stmt))
            owner = entry.func if entry.func is not None else None
            if (
                block is None
                or block.func is not owner
                or block.owner is not (entry.func.body if entry.func is not None else ctx.module)
            ):
                continue  # inside a branch or loop: not the one value every run has
            if isinstance(entry, Home) and entry.guard is not None:
                continue
            entry.anchor, entry.top_of = a.stmt, None
            entry.device_source = device.DeviceSource(expr.value, (expr.value,), "int", a.stmt)
            return


def _is_int_constant(value: cst.BaseExpression | None) -> bool:
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return isinstance(value, cst.Integer)


def _existing(ctx: FileContext) -> Entry | None:
    """The script creates its communicator already (converted before)."""
    for a in ctx.facts.assigns:
        if isinstance(a.value, cst.Call) and len(a.targets) == 1:
            q = getattr(ctx.facts.call_of(a.value), "qname", "")
            if vocab.is_communicator_factory(q):
                return Entry(func=a.func, comm=a.targets[0], exists=True, creation=a.stmt)
    return None


# ------------------------------------------------------------------------ where the args go
def _namespace_home(ctx: FileContext) -> Home | None:
    """Where the parsed arguments end up: the entry point that trains with them."""
    homes = []
    for call in ctx.facts.calls:
        if call.method in _PARSE_METHODS and call.stmt is not None:
            found = _home_of(ctx, call, _PARSE_METHODS[call.method], 0)
            if found is not None:
                homes.append(found)
    if not homes:
        return None
    return min(homes, key=lambda h: _preference(ctx, h.func))


def _preference(ctx: FileContext, func: cst.FunctionDef | None) -> int:
    """Lower is better: ``main``, then a function that trains (itself or through the
    module's functions it calls), then anything else."""
    if func is not None and func.name.value == "main":
        return 0
    return 1 if _trains(ctx, func, 0) else 2


def _is_training_call(ctx: FileContext, call: CallFact) -> bool:
    q = call.qname
    return ctx.builds_optimizer(call) or vocab.is_iterator(q) or vocab.is_trainer(q)


def _trains(ctx: FileContext, func: cst.FunctionDef | None, depth: int) -> bool:
    for c in ctx.facts.calls:
        if c.func is not func:
            continue
        if _is_training_call(ctx, c):
            return True
        callee = ctx.facts.module_functions.get(c.qname.lstrip("."))
        if callee is not None and callee is not func and depth < 3:
            if _trains(ctx, callee, depth + 1):
                return True
    return False


def _home_of(ctx: FileContext, call: CallFact, index: int | None, depth: int) -> Home | None:
    """Follow the namespace that ``call`` produces (``index``: its place in a returned tuple)."""
    passed = _passed_to_function(ctx, call, index)
    if passed is not None:
        return passed
    stmt = call.stmt
    assert stmt is not None
    name = _assigned_name(ctx, call.node, index)
    if name is None:
        returned = _returned_index(stmt, call.node, None)
        if returned is False or call.func is None:
            return None
        if returned is not None and index is not None:
            return None  # a (namespace, rest) pair inside a returned tuple: not followed
        return _through_helper(ctx, call.func, index if returned is None else returned, depth)
    if call.func is not None:
        returned = _returned_by(call.func, name)
        if returned is not False:
            return _through_helper(ctx, call.func, returned, depth)
        block = ctx.facts.block_of.get(id(stmt))
        if block is None or block.func is not call.func:
            return Home(func=call.func, top_of=call.func, args=name)
        return Home(func=call.func, anchor=_outermost(ctx, stmt, None), args=name)
    return _module_level_home(ctx, stmt, name)


def _through_helper(
    ctx: FileContext, helper: cst.FunctionDef, index: int | None, depth: int
) -> Home | None:
    """``helper`` only returns the namespace: its callers are where the arguments go."""
    if depth >= 4:
        return None
    name = helper.name.value
    sites = [s for s in ctx.facts.calls if s.qname.lstrip(".") == name and s.stmt is not None]
    homes = [h for s in sites if (h := _home_of(ctx, s, index, depth + 1)) is not None]
    if not homes:
        return None
    best = min(homes, key=lambda h: _preference(ctx, h.func))
    if not best.why:
        best.why = f"{name}() only parses and returns the arguments"
    return best


def _module_level_home(ctx: FileContext, stmt: cst.BaseStatement, name: str) -> Home:
    """``args`` bound at module level: handed to the function that trains (``main(args)``),
    else kept at module level -- inside the main guard when the training code is there."""
    guard = _main_guard(ctx)
    if not _module_level_training(ctx):
        handed: list[Home] = []
        for site in ctx.facts.calls:
            func = ctx.facts.module_functions.get(site.qname.lstrip("."))
            if site.func is not None or site.cls is not None or func is None:
                continue
            param = _parameter_for(site, func, lambda v: _is_name(v, name))
            if param is not None:
                why = f"{name} is handed to {func.name.value}(), which runs the training"
                handed.append(Home(func=func, top_of=func, args=param, why=why))
        if handed:
            return min(handed, key=lambda h: _preference(ctx, h.func))
    if guard is not None and _training_inside(ctx, guard) and not ctx.facts.within(stmt, guard):
        return Home(func=None, guard=guard, args=name, fallback=_outermost(ctx, stmt, None))
    return Home(func=None, anchor=_outermost(ctx, stmt, guard), args=name)


def _last_import(ctx: FileContext) -> cst.BaseStatement | None:
    return ctx.facts.imports[-1] if ctx.facts.imports else None


def _is_name(value: cst.BaseExpression, name: str) -> bool:
    return isinstance(value, cst.Name) and value.value == name


def _passed_to_function(ctx: FileContext, call: CallFact, index: int | None) -> Home | None:
    """``main(parser.parse_args())`` / ``main(get_args())``: the entry is ``main``, the
    namespace its parameter."""
    if index is not None:
        return None
    parent = ctx.facts.call_of(call.parent_call)
    if parent is None:
        return None
    func = ctx.facts.module_functions.get(parent.qname.lstrip("."))
    if func is None:
        return None
    param = _parameter_for(parent, func, lambda v: v is call.node)
    if param is None:
        return None
    return Home(func=func, top_of=func, args=param)


def _parameter_for(site: CallFact, func: cst.FunctionDef, matches: object) -> str | None:
    """The parameter of ``func`` that receives the argument of ``site`` matching ``matches``."""
    assert callable(matches)
    positional = [a for a in site.node.args if a.keyword is None]
    for arg in site.node.args:
        if not matches(arg.value) or arg.star:
            continue
        if arg.keyword is not None:
            return arg.keyword.value
        index = positional.index(arg)
        params = func.params.params
        return params[index].name.value if index < len(params) else None
    return None


def _assigned_name(ctx: FileContext, value: cst.Call, index: int | None) -> str | None:
    """The name ``value`` is bound to (``index``: the element of a tuple it is unpacked into)."""
    for a in ctx.facts.assigns:
        if a.value is not value or not isinstance(a.node, cst.Assign):
            continue
        if len(a.node.targets) != 1:
            return None
        target = a.node.targets[0].target
        if index is None:
            return target.value if isinstance(target, cst.Name) else None
        if isinstance(target, (cst.Tuple, cst.List)) and index < len(target.elements):
            element = target.elements[index].value
            return element.value if isinstance(element, cst.Name) else None
        return None
    return None


def _returned_index(
    stmt: cst.BaseStatement, node: cst.BaseExpression, name: str | None
) -> int | None | bool:
    """Whether ``stmt`` is ``return X`` (None) or ``return ..., X, ...`` (X's index) for the
    node (or the name); False when it returns neither."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if not isinstance(small, cst.Return) or small.value is None:
            continue
        value = small.value
        if value is node or (name is not None and _is_name(value, name)):
            return None
        if isinstance(value, cst.Tuple):
            for i, element in enumerate(value.elements):
                if element.value is node or (name is not None and _is_name(element.value, name)):
                    return i
    return False


def _returned_by(func: cst.FunctionDef, name: str) -> int | None | bool:
    """Whether ``func`` returns the variable ``name`` (see :func:`_returned_index`)."""

    class _Returns(cst.CSTVisitor):
        found: int | None | bool = False

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            got = _returned_index(node, cst.Name(name), name)
            if got is not False and self.found is False:
                self.found = got

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is func

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

    visitor = _Returns()
    func.visit(visitor)
    return visitor.found


def _outermost(
    ctx: FileContext, stmt: cst.BaseStatement, stop: cst.BaseStatement | None
) -> cst.BaseStatement:
    """Where the communicator goes after ``stmt``: ``args`` parsed in one branch of an ``if``
    (``if argv: args = p.parse_args(argv) else: ...``) gets it after the whole ``if``, unless
    the training runs inside that ``if`` (or ``stop``, the main guard, is reached)."""
    current = stmt
    while True:
        parent = ctx.facts.parent_statement(current)
        if parent is None or parent is stop or not isinstance(parent, cst.If):
            return current
        if any(
            _is_training_call(ctx, c) and c.stmt is not None and ctx.facts.within(c.stmt, parent)
            for c in ctx.facts.calls
        ):
            return current
        current = parent


def _main_guard(ctx: FileContext) -> cst.If | None:
    """The module's ``if __name__ == '__main__':`` block."""
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.If) and isinstance(stmt.body, cst.IndentedBlock):
            code = ctx.code(stmt.test).replace("'", '"')
            if "__name__" in code and '"__main__"' in code:
                return stmt
    return None


def _module_level_calls(ctx: FileContext) -> list[CallFact]:
    return [
        c for c in ctx.facts.calls if c.func is None and c.cls is None and _is_training_call(ctx, c)
    ]


def _module_level_training(ctx: FileContext) -> bool:
    return bool(_module_level_calls(ctx))


def _training_inside(ctx: FileContext, guard: cst.If) -> bool:
    """The module-level training code all sits inside the main guard."""
    calls = _module_level_calls(ctx)
    return bool(calls) and all(
        c.stmt is not None and ctx.facts.within(c.stmt, guard) for c in calls
    )


# ------------------------------------------------------------------------ which communicator
def uses_gpu_statically(ctx: FileContext) -> bool:
    return any(c.method in ("to_gpu",) or c.qname in vocab.DEVICE_GETTERS for c in ctx.facts.calls)


@dataclass(frozen=True)
class Choice:
    """The communicator name as emitted code, and why, for the report."""

    expr: str
    gpu_test: str | None  # the run-time test, when the flag decides
    why: str


def choose(ctx: FileContext) -> Choice:
    """Which communicator the emitted code creates (docs/design.md §1)."""
    entry = ctx.entry
    cpu = vocab.cpu_communicator(ctx.options.target)
    gpu = vocab.GPU_COMMUNICATOR
    if ctx.options.communicator != "auto":
        name = ctx.options.communicator
        return Choice(ctx.q(name), None, f"'{name}', as --communicator says")
    flag = device.find_flag(ctx)
    if entry is not None and entry.args is not None and flag is not None:
        test = device.gpu_test(ctx, flag, entry.args)
        return Choice(
            f"{ctx.q(gpu)} if {test} else {ctx.q(cpu)}",
            test,
            f"'{gpu}' when {flag.option} selects a GPU ({test}), else '{cpu}' (CPU)",
        )
    if entry is not None and entry.device_source is not None:
        source = entry.device_source
        test = device.source_test(ctx, source)
        return Choice(
            f"{ctx.q(gpu)} if {test} else {ctx.q(cpu)}",
            test,
            f"'{gpu}' when {source.text} (set in the code) selects a GPU, else '{cpu}' "
            "(CPU), decided at run time after it is set",
        )
    if uses_gpu_statically(ctx):
        return Choice(
            ctx.q(gpu),
            None,
            f"'{gpu}': the script puts its model on a GPU and has no device flag to read",
        )
    return Choice(ctx.q(cpu), None, f"'{cpu}': the script never selects a GPU (CPU run)")


def creation_statements(ctx: FileContext) -> list[cst.BaseStatement]:
    """``comm = ...create_communicator(...)`` and the device remap that follows it."""
    entry = ctx.entry
    assert entry is not None
    create = ctx.runtime.top("create_communicator")
    choice = choose(ctx)
    name_expr = choice.expr
    line = f"{entry.comm} = {create}({name_expr})\n"
    if len(line) > 80:
        inner = f"    {name_expr}\n"
        if len(inner) > 80 and choice.gpu_test is not None:
            cpu = ctx.q(vocab.cpu_communicator(ctx.options.target))
            gpu = ctx.q(vocab.GPU_COMMUNICATOR)
            inner = f"    {gpu}\n    if {choice.gpu_test}\n    else {cpu}\n"
        line = f"{entry.comm} = {create}(\n{inner})\n"
    out: list[cst.BaseStatement] = [statement(line)]
    if not ctx.options.data_parallel:
        out.append(statement(_same_initial_weights(ctx)))
    flag = device.find_flag(ctx)
    if entry.device_source is not None:
        source = entry.device_source
        out.append(
            statement(
                f"if {device.source_test(ctx, source)}:\n"
                "    # one GPU per rank, numbered within the node (intra_rank, not rank)\n"
                f"    {device.source_remap(ctx, source, entry.comm)}\n"
            )
        )
    if flag is not None and entry.args is not None:
        test = device.gpu_test(ctx, flag, entry.args)
        out.append(
            statement(
                f"if {test}:\n"
                "    # one GPU per rank, numbered within the node (intra_rank, not rank)\n"
                f"    {device.remap(ctx, flag, entry.args, entry.comm)}\n"
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


# ------------------------------------------------------------------------ emitting
def emit_helper_fetches(ctx: FileContext) -> None:
    """``comm = mn.current_communicator()`` at the top of each training helper whose code now
    uses the communicator (its signature stays as it is; see ``FileContext.training_helper``)."""
    entry = ctx.entry
    if entry is None or entry.exists or not ctx.helpers_given_comm:
        return
    ctx.use_runtime()
    fetch = f"{entry.comm} = {ctx.runtime.top('current_communicator')}()\n"
    for helper in ctx.helpers_given_comm.values():
        if not isinstance(helper.body, cst.IndentedBlock):
            continue
        stmts = list(helper.body.body)
        first = 1 if stmts and _is_docstring(stmts[0]) and len(stmts) > 1 else 0
        ctx.plan.insert_before(stmts[first], [statement(fetch)])
        cls = ctx.facts.func_class.get(id(helper))
        name = f"{cls.name.value}.{helper.name.value}" if cls is not None else helper.name.value
        ctx.note(
            stmts[first],
            "communicator",
            "changed",
            f"{name}() trains with an optimizer it does not hand back: it keeps its "
            f"signature and takes the communicator main() created with "
            f"{ctx.runtime.top('current_communicator')}()",
        )


def emit(ctx: FileContext, preamble: list[cst.BaseStatement]) -> None:
    """Insert the communicator (after the other rewrites decided they need it)."""
    entry = ctx.entry
    if entry is None or entry.exists or not ctx.comm_needed:
        return
    _before_creation(ctx, entry, bool(preamble))
    new = [*preamble, *creation_statements(ctx)]
    if ctx.distribute_trainers:  # training out of the converter's reach (rewrites.trainers)
        new.append(statement(f"{ctx.runtime.top('distribute_trainers')}({entry.comm})\n"))
    guard = entry.guard if isinstance(entry, Home) else None
    if entry.anchor is not None:
        if ctx.suppressed(entry.anchor, "communicator"):
            return
        ctx.plan.insert_after(entry.anchor, new)
        where: cst.CSTNode = entry.anchor
        place = f"right after `{_first_line(ctx, entry.anchor)}`"
    else:
        block = entry.top_of or guard
        stmts: list[cst.BaseStatement]
        if block is None:
            stmts = list(ctx.module.body)
        elif isinstance(block.body, cst.IndentedBlock):
            stmts = list(block.body.body)
        else:
            return  # `def main(): ...` on one line: nowhere to put it
        first = 1 if stmts and _is_docstring(stmts[0]) and len(stmts) > 1 else 0
        ctx.plan.insert_before(stmts[first], new)
        where = stmts[first]
        place = "at its top"
    ctx.note(
        where,
        "communicator",
        "changed",
        f"create the communicator {entry.comm} in {_scope(ctx, entry)}, {place}"
        + (f" ({entry.why})" if isinstance(entry, Home) and entry.why else "")
        + f": {choose(ctx).why}",
    )
    flag = device.find_flag(ctx)
    if flag is not None and entry.args is not None:
        ctx.note(
            where,
            "device",
            "changed",
            f"each rank uses its own GPU, comm.intra_rank, when {flag.option} selects one: "
            f"`{device.remap(ctx, flag, entry.args, entry.comm)}`",
        )
    elif entry.device_source is not None and len(entry.device_source.path) > 1:
        source = entry.device_source
        ctx.note(
            where,
            "device",
            "changed",
            f"each rank uses its own GPU, comm.intra_rank, when {source.text} selects one: "
            f"`{device.source_remap(ctx, source, entry.comm)}`",
        )


def _top_level(ctx: FileContext, node: cst.CSTNode, stop: cst.FunctionDef | None) -> cst.CSTNode:
    """The statement of the module's (or function ``stop``'s) own body that holds ``node``."""
    current: cst.CSTNode = node
    while isinstance(current, cst.BaseStatement):
        parent = ctx.facts.parent_statement(current)
        if parent is None or parent is stop:
            break
        current = parent
    return current


def _before_creation(ctx: FileContext, entry: Entry, forkserver: bool) -> None:
    """Statements planned to use ``comm`` that run before the statement creating it (a print
    above ``args = parser.parse_args()``, or above the main guard). A module-level script
    without a forkserver gets its communicator moved up to where the arguments are parsed (or
    the imports end) when that is early enough; otherwise their rank guards are dropped -- they
    run on every rank, as before -- and a person is told."""
    func = entry.func
    body: list[cst.BaseStatement]
    if func is None:
        body = list(ctx.module.body)
    elif isinstance(func.body, cst.IndentedBlock):
        body = list(func.body.body)
    else:
        return
    creation: cst.CSTNode | None = None
    if isinstance(entry, Home) and entry.guard is not None:
        creation = entry.guard
    elif entry.anchor is not None:
        creation = _top_level(ctx, entry.anchor, func)
    if creation is None or not any(s is creation for s in body):
        return
    limit = next(i for i, s in enumerate(body) if s is creation)
    plan = ctx.plan
    keys = [*plan.guard, *plan.before, *plan.after, *plan.replace]
    early: dict[int, cst.CSTNode] = {}
    for key in keys:
        node = plan.nodes.get(key)
        if node is None:
            continue
        within = plan.replaced_within.get(key, node) if key in plan.replace else node
        top = _top_level(ctx, within, func) if within is not None else None
        if isinstance(top, (cst.FunctionDef, cst.ClassDef)):
            continue  # a definition's body runs when it is called, after comm exists
        index = next((i for i, s in enumerate(body) if s is top), None)
        if index is not None and index < limit:
            early[index] = node
    if not early:
        return
    fallback = entry.fallback if isinstance(entry, Home) else None
    first_early = min(early)
    if not forkserver and isinstance(entry, Home) and entry.guard is not None:
        at = next((i for i, s in enumerate(body) if s is fallback), None)
        if fallback is not None and at is not None and at < first_early:
            entry.guard, entry.anchor = None, fallback
            entry.why = "statements before the main guard use it"
            return
    for index in sorted(early):
        node = early[index]
        stmt = body[index]
        if plan.is_guarded(stmt) or any(plan.is_guarded(s) for s in _statements(node)):
            for inner in (stmt, *_statements(node)):
                ctx.withdraw_guard(inner)
        why = (
            "which stays under `if __name__ == '__main__':` because the forkserver "
            "re-imports the script"
            if forkserver and isinstance(entry, Home) and entry.guard is not None
            else "which needs the parsed arguments"
        )
        ctx.note(
            stmt,
            "communicator",
            "needs-person",
            f"`{_first_line(ctx, stmt)}` runs before the communicator is created ({why}): "
            "it is left on every rank; move it below the communicator",
        )


def _statements(node: cst.CSTNode) -> list[cst.BaseStatement]:
    return [node] if isinstance(node, cst.BaseStatement) else []


def _scope(ctx: FileContext, entry: Entry) -> str:
    if entry.func is not None:
        return f"{entry.func.name.value}()"
    guard = entry.guard if isinstance(entry, Home) else None
    if guard is not None or (
        entry.anchor is not None
        and (main_guard := _main_guard(ctx)) is not None
        and ctx.facts.within(entry.anchor, main_guard)
    ):
        return "the `if __name__ == '__main__':` block"
    return "the module"


def _first_line(ctx: FileContext, stmt: cst.CSTNode) -> str:
    code = ctx.code(stmt).strip().splitlines()
    return code[0].rstrip(":") if code else ""


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
