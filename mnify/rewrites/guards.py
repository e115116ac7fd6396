"""docs/design.md §1, step "rank-0 guards": only rank 0 writes files and prints.

Under ``if comm.rank == 0:`` go (neighbours share one ``if``): the writing and reporting
extensions (LogReport, PrintReport and their subclasses, ProgressBar, PlotReport, snapshots,
dump_graph, VariableStatisticsPlot, and user extensions, ``@training.make_extension``
functions or ``Extension`` subclasses, whose bodies write), informational ``print``s, and every
file write wherever it stands, before or after training: ``serializers.save_*``, ``np.save``,
``pickle.dump``, ``json.dump``, ``plt.savefig``, image dumps, ``open(path, 'w')`` (also as a
``with`` block), ``os.makedirs`` of the result directory and config copies. An ``if`` whose whole
body is such statements is guarded as a whole. A helper function that only writes has its calls
guarded where the entry point makes them (``call_sites``), in whichever file of the tree it is; one
that writes files and returns what it made (``out = prepare_output_dir(args)``) runs on rank 0
and every rank gets its result, ``comm.bcast_obj(...)``; a method of the user's class that only
writes is guarded where it is called (``helper_writes``). Whatever reaches a collective stays on
every rank; so do extensions that change training state (ExponentialShift, evaluators) and
loads (``load_npz(args.resume, trainer)``). Prints that name the rank are meant for every rank.

An installed package's extension (chainer-chemistry's ``AutoPrintReport``) is neither guarded
nor left as it is: nothing here reads what it does, and it may change what every rank shares,
so it stays on every rank and prints on rank 0 only, ``trainer.extend(mn.quiet_on_other_ranks(
AutoPrintReport(), comm))`` (a LogReport it may read stays on every rank with its file on rank
0's). Evaluators are the evaluator step's.

Where the training runs through ``mn.distribute_trainers`` (MN813), the helpers and methods the
entry points reach, in any file, take the communicator with ``comm = mn.current_communicator()``
and have each statement that only writes files (``with open(path, 'w') as f: json.dump(...)`` in
a pipeline's ``persist()``, a package's writer called alone) put on rank 0 where it is
(``rewrites.trainers``). Code the entry points never reach (a data-preparation script's
helpers) may run where no communicator exists and is left as it is.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.effects import Effect
from mnify.program.facts import CallFact
from mnify.rewrites import call_sites, helper_writes
from mnify.rewrites.context import FileContext, Lift
from mnify.rewrites.edits import Guard, expression
from mnify.rewrites.file_handles import HandleFamily, families
from mnify.rewrites.registry import rewrite
from mnify.rewrites.report import ReportEntry
from mnify.rewrites.wrapping import wrap_call
from mnify.syntax import argument_node, assigned_in, log_name_by_rank, mentions_rank, names_in

RANK0 = Guard("rank0")
# writers whose file holds model parameters: incomplete under model parallel on rank 0 alone
_MODEL_SAVERS = frozenset({"snapshot", "snapshot_object", "save_npz", "save_hdf5"})
_EXTENSION = "extension"  # what a user extension that writes is called in messages


def _code_of(what: str) -> str:
    """The lint rule a writer falls under: prints MN902, extensions MN401, file writes MN402."""
    if what == "print":
        return "MN902"
    if what in vocab.REPORTING_EXTENSION_NAMES or what == _EXTENSION:
        return "MN401"
    return "MN402"


def _writes_mode(call: cst.Call) -> bool:
    """``open(path, 'w')`` and the other modes that write."""
    mode: cst.BaseExpression | None = None
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) > 1:
        mode = positional[1].value
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "mode":
            mode = arg.value
    if not isinstance(mode, cst.SimpleString):
        return False
    text = str(mode.evaluated_value)
    return any(flag in text for flag in vocab.WRITE_MODES)


def _is_open_for_writing(ctx: FileContext, node: cst.BaseExpression | None) -> bool:
    fact = ctx.facts.call_of(node)
    return (
        fact is not None
        and fact.qname in ("open", "builtins.open", "io.open")
        and _writes_mode(fact.node)
    )


def _user_extension(ctx: FileContext, expr: cst.BaseExpression) -> bool:
    """An extension defined in this file that writes: a ``make_extension`` function, a factory
    returning one, or an ``Extension``/reporting subclass (its own writes, or its base's)."""
    name: str | None = None
    if isinstance(expr, cst.Name):
        name = expr.value
    else:
        fact = ctx.facts.call_of(expr)
        if fact is not None and fact.qname and "." not in fact.qname.lstrip("."):
            name = fact.qname.lstrip(".")
    if name is None:
        return False
    return name in ctx.writing_extensions


def _writer_name(ctx: FileContext, call: CallFact) -> str | None:
    """What this call writes, when it is a statement only rank 0 should run."""
    if call.qname in ("print", "builtins.print"):
        # a print that names the rank is meant for every rank ("rank 3 ready")
        return None if mentions_rank(call.node) else "print"
    if vocab.is_file_writer(call.qname):
        return vocab.last(call.qname)
    if call.method in vocab.WRITER_METHODS:
        return call.method
    func = call.node.func
    if isinstance(func, cst.Attribute):
        receiver = func.value
        if call.method == "save":
            made = ctx.facts.call_of(receiver)
            if made is not None and vocab.is_image_factory(made.qname):
                return "image"
        if call.method in ("write", "writelines") and _is_open_for_writing(ctx, receiver):
            return "open"
    if _is_open_for_writing(ctx, call.node) and isinstance(call.stmt, cst.With):
        return "open"
    if call.method == "extend" and call.node.args:
        ext = call.node.args[0].value
        fact = ctx.facts.call_of(ext)
        if fact is not None and vocab.is_extension(fact.qname, *vocab.REPORTING_EXTENSION_NAMES):
            return vocab.last(fact.qname)
        if _user_extension(ctx, ext):
            return _EXTENSION
        if isinstance(ext, cst.Name):
            for a in ctx.facts.assigns_of(ext.value):
                made = ctx.facts.call_of(a.value)
                if made is not None and vocab.is_extension(
                    made.qname, *vocab.REPORTING_EXTENSION_NAMES
                ):
                    return vocab.last(made.qname)
                if a.value is not None and _user_extension(ctx, a.value):
                    return _EXTENSION
    return None


def _log_report_call(
    ctx: FileContext, call: CallFact
) -> tuple[cst.Call, cst.BaseStatement | None] | None:
    """The ``LogReport(...)`` construction that ``trainer.extend(...)`` adds, if it adds one,
    and the statement it stands in."""
    if call.method != "extend" or not call.node.args:
        return None
    ext = call.node.args[0].value
    values: list[tuple[cst.BaseExpression | None, cst.BaseStatement | None]] = [(ext, call.stmt)]
    if isinstance(ext, cst.Name):
        values += [(a.value, a.stmt) for a in ctx.facts.assigns_of(ext.value)]
    for value, stmt in values:
        made = ctx.facts.call_of(value)
        if made is not None and vocab.is_extension(made.qname, "LogReport"):
            return made.node, stmt
    return None


def _log_read_after(ctx: FileContext, call: CallFact) -> bool:
    """Whether the script reads the LogReport back on every rank: ``get_extension('LogReport')``
    or ``.log`` of the name the LogReport is bound to. Then the extension must exist on every
    rank; only its file is rank 0's."""
    for other in ctx.facts.calls:
        if other.method == "get_extension" and other.node.args:
            name = other.node.args[0].value
            if isinstance(name, cst.SimpleString) and name.evaluated_value == "LogReport":
                return True
        if _package_extension(ctx, other) is not None:
            return True
    ext = call.node.args[0].value
    if isinstance(ext, cst.Name):
        bound = ext.value
        return any(
            isinstance(n, cst.Attribute)
            and isinstance(n.value, cst.Name)
            and n.value.value == bound
            and n.attr.value == "log"
            for n in ctx.facts.attributes
        )
    return False


def _package_extension(ctx: FileContext, call: CallFact) -> CallFact | None:
    """The ``Ext(...)`` of ``trainer.extend(Ext(...))`` with ``Ext`` an installed package's (not
    Chainer's), seen through ``mn.quiet_on_other_ranks``: it may read the LogReport on every
    rank (chainer-chemistry's AutoPrintReport does), so that one stays on every rank
    (program/effects.py says where ``Ext`` is defined)."""
    if call.method != "extend" or not call.node.args or ctx.effects is None:
        return None
    made = ctx.facts.call_of(call.node.args[0].value)
    if made is not None and vocab.is_runtime_name(made.qname, "quiet_on_other_ranks"):
        made = ctx.facts.call_of(made.node.args[0].value) if made.node.args else None
    name = ctx.called_by(made) if made is not None else None
    if made is None or name is None or vocab.is_chainer_name(made.qname):
        return None
    if ctx.effects.resolves_outside(ctx.path, ctx.line(made.node), name) is None:
        return None
    return made


def _quiet_package_extensions(ctx: FileContext) -> None:
    """An installed package's extension stays on every rank (it may change what every rank
    shares, and nothing here reads what it does: docs/converter.md), printing on rank 0 only:
    ``trainer.extend(mn.quiet_on_other_ranks(Ext(...), comm))``."""
    if ctx.options.target != "mnify":
        return
    wrap = ctx.spell.top("quiet_on_other_ranks")
    for call in ctx.facts.calls:
        stmt = call.stmt
        made = _package_extension(ctx, call)
        if made is None or stmt is None or made.node is not call.node.args[0].value:
            continue  # not one, or wrapped before
        if vocab.is_evaluator_class(made.qname) or id(made.node) in ctx.plan.replace:
            continue  # an evaluator: made multi-node by the evaluator step
        if ctx.on_rank0_already(stmt) or ctx.plan.is_guarded(stmt):
            continue
        comm = ctx.comm_at(call.func, "extension")
        if comm is None:
            continue  # registered where the communicator is not: it prints on every rank
        ctx.use_runtime()
        ctx.plan.replace_node(made.node, wrap_call(wrap, comm), stmt)
        ctx.note(
            stmt,
            "rank0-guard",
            "changed",
            f"{vocab.last(made.qname)} (an installed package's extension) stays on every rank "
            f"and prints on rank 0 only: {wrap}(..., {comm})",
            "MN401",
        )


def _log_name_on_rank0(comm: str) -> Callable[[cst.CSTNode], cst.CSTNode]:
    """``LogReport(...)`` whose file only rank 0 writes: its name (``filename``, or the older
    ``log_name``, Chainer's default ``'log'``) becomes ``X if comm.rank == 0 else None``. Chainer
    falls back from ``filename=None`` to ``log_name``, so that one is ``None`` too."""

    def edit(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        args = list(node.args)
        filename = argument_node(node, 3, "filename")
        log_name = argument_node(node, 99, "log_name")
        empty = cst.Module(body=[])

        def by_rank(arg: cst.Arg) -> cst.Arg:
            code = empty.code_for_node(arg.value)
            return arg.with_changes(value=expression(f"{code} if {comm}.rank == 0 else None"))

        def keyword(text: str) -> cst.Arg:
            made = expression(f"f({text})")
            assert isinstance(made, cst.Call)
            return made.args[0]

        if filename is not None:
            args[args.index(filename)] = by_rank(filename)
            if log_name is not None:
                args[args.index(log_name)] = log_name.with_changes(value=cst.Name("None"))
            else:
                args.append(keyword("log_name=None"))
        elif log_name is not None:
            args[args.index(log_name)] = by_rank(log_name)
        else:
            args.append(keyword(f"log_name='log' if {comm}.rank == 0 else None"))
        for i in range(len(args) - 1):
            if args[i].comma is cst.MaybeSentinel.DEFAULT:
                args[i] = args[i].with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
        return node.with_changes(args=args)

    return edit


def _guardable(ctx: FileContext, stmt: cst.BaseStatement) -> list[str] | None:
    """The writers in a statement made only of writer calls, else None."""
    if isinstance(stmt, cst.SimpleStatementLine):
        calls = {id(c.node): c for c in ctx.facts.calls_by_stmt.get(id(stmt), [])}
        found: list[str] = []
        for small in stmt.body:
            if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
                return None
            fact = calls.get(id(small.value))
            what = _writer_name(ctx, fact) if fact is not None else None
            if what is None:
                return None
            found.append(what)
        return found
    if isinstance(stmt, cst.With) and isinstance(stmt.body, cst.IndentedBlock):
        # `with open(path, 'w') as f:` writing, binding nothing the code after it reads
        if not all(_is_open_for_writing(ctx, item.item) for item in stmt.items):
            return None
        block = ctx.facts.block_of.get(id(stmt))
        if block is not None:
            siblings = list(block.body)
            later = names_in(siblings[siblings.index(stmt) + 1 :])
            if assigned_in(list(stmt.body.body)) & later:
                return None
        return ["open"]
    if isinstance(stmt, cst.If) and isinstance(stmt.body, cst.IndentedBlock):
        found = []
        bodies = [stmt.body]
        if isinstance(stmt.orelse, cst.Else) and isinstance(stmt.orelse.body, cst.IndentedBlock):
            bodies.append(stmt.orelse.body)
        elif stmt.orelse is not None:
            return None
        for body in bodies:
            for inner in body.body:
                got = _guardable(ctx, inner)
                if got is None:
                    return None
                found.extend(got)
        return found
    return None


def _calls_in(ctx: FileContext, scope: cst.FunctionDef | cst.ClassDef) -> list[CallFact]:
    return [c for c in ctx.facts.calls if ctx.outermost_scope(c.func) is scope]


def _writes(ctx: FileContext, scope: cst.FunctionDef | cst.ClassDef, depth: int = 2) -> bool:
    """Whether code in ``scope`` writes, itself or through this file's functions it calls
    (``write_pgm(path, image)`` from an extension), a couple of calls deep."""
    for call in _calls_in(ctx, scope):
        if _writer_name(ctx, call) is not None:
            return True
        callee = ctx.facts.module_functions.get(call.qname.lstrip("."))
        if depth > 0 and callee is not None and callee is not scope:
            if _writes(ctx, callee, depth - 1):
                return True
    return False


_STATEFUL_METHODS = frozenset({"update", "setup", "extend", "run", "add_hook", "to_gpu"})


def _writes_only(ctx: FileContext, func: cst.FunctionDef, *, returns: bool = False) -> bool:
    """A module-level helper whose only effect is writing: it writes, changes no training state
    (no optimizer step, no extension added, no collective), and returns nothing but, for an
    extension factory, its nested extension function (anything, with ``returns``)."""
    nested = (
        {s.name.value for s in func.body.body if isinstance(s, cst.FunctionDef)}
        if isinstance(func.body, cst.IndentedBlock)
        else set()
    )
    for stmt in func.body.body if isinstance(func.body, cst.IndentedBlock) else ():
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Global, cst.Nonlocal)):
                    return False
                if isinstance(small, cst.Return) and small.value is not None and not returns:
                    if not (isinstance(small.value, cst.Name) and small.value.value in nested):
                        return False
    for call in _calls_in(ctx, func):
        if _writer_name(ctx, call) is not None:
            continue
        if call.method in _STATEFUL_METHODS or call.method in vocab.COLLECTIVE_METHODS:
            return False
        if vocab.is_scatter(call.qname) or vocab.is_communicator_factory(call.qname):
            return False
    return True


def _makes_files_only(ctx: FileContext, func: cst.FunctionDef) -> bool:
    """A helper that writes files (not only prints) and builds nothing Chainer or this file's
    classes make: what it returns is a path or a record, safe for rank 0 to make alone."""
    calls = _calls_in(ctx, func)
    writers = [w for w in (_writer_name(ctx, c) for c in calls) if w is not None]
    if not any(w != "print" for w in writers):
        return False
    if any(
        vocab.is_chainer_name(c.qname) or c.qname.lstrip(".") in ctx.facts.classes for c in calls
    ):
        return False
    return not _returns_a_handle(ctx, func)


# what a helper may make and return that cannot be handed to other ranks (bcast_obj pickles it)
_HANDLE_MAKERS = frozenset(
    {
        "open",
        "builtins.open",
        "io.open",
        "codecs.open",
        "csv.writer",
        "csv.DictWriter",
        "tempfile.NamedTemporaryFile",
        "logging.getLogger",
        "logging.FileHandler",
    }
)


def _returns_a_handle(ctx: FileContext, func: cst.FunctionDef) -> bool:
    """``f = open(path, 'w'); ...; return f`` (or ``return open(...)``): a file, writer or
    logger, which only the process that made it can use."""
    returned: list[cst.BaseExpression] = []

    class _Returns(cst.CSTVisitor):
        def visit_Return(self, node: cst.Return) -> None:
            if node.value is not None:
                returned.append(node.value)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is func

    func.visit(_Returns())
    for value in returned:
        values: list[cst.BaseExpression | None] = [value]
        if isinstance(value, cst.Name):
            values += [a.value for a in ctx.facts.assigns_of(value.value) if a.func is func]
        for v in values:
            made = ctx.facts.call_of(v)
            if made is not None and made.qname.lstrip(".") in _HANDLE_MAKERS:
                return True
    return False


def _lift_writing_method(ctx: FileContext, call: CallFact, cls: cst.ClassDef, what: str) -> None:
    """A method of ``cls`` (not an extension) whose only effect is writing: its callers guard
    the call (``helper_writes``)."""
    method = call.func
    if (
        method is None
        or ctx.facts.func_class.get(id(method)) is not cls
        or cls.name.value in ctx.writing_extensions
        or not helper_writes.guardable_method(method.name.value)
        or not _writes_only(ctx, method)
    ):
        return
    if any(
        (lift.name, lift.kind, lift.module) == (method.name.value, "rank0-method", ctx.module_name)
        for lift in ctx.lifts
    ):
        return
    ctx.lifts.append(Lift(method.name.value, "rank0-method", what, method, ctx.module_name))


def _writing_extensions(ctx: FileContext) -> set[str]:
    """Names of this file's extensions that write: ``make_extension`` functions and factories
    of them, and ``Extension``/reporting-extension subclasses."""
    found: set[str] = set()
    for name, func in ctx.facts.module_functions.items():
        decorated = [func] + [
            s
            for s in (func.body.body if isinstance(func.body, cst.IndentedBlock) else ())
            if isinstance(s, cst.FunctionDef)
        ]
        if any(
            any(q in vocab.EXTENSION_DECORATORS for q in ctx.facts.decorators.get(id(f), ()))
            for f in decorated
        ) and _writes(ctx, func):
            found.add(name)
    for name, bases in ctx.facts.class_bases.items():
        if any(vocab.is_reporting_extension(b) for b in bases):
            found.add(name)
        elif any(vocab.is_extension_base(b) for b in bases) and _writes(
            ctx, ctx.facts.classes[name]
        ):
            found.add(name)
    return found


def _plan_handles(ctx: FileContext) -> list[HandleFamily]:
    """Guard each family of write handles as a whole (``file_handles``); the families guarded."""
    opens = {id(c.node) for c in ctx.facts.calls if _is_open_for_writing(ctx, c.node)}
    planned: list[HandleFamily] = []
    for family in families(ctx.facts, ctx.module, opens):
        stmts = [*family.bindings, *family.uses]
        block = ctx.facts.block_of.get(id(family.bindings[0]))
        func = block.func if block is not None else None
        if (
            any(ctx.before_comm_exists(s) or ctx.reaches_collective(s) for s in stmts)
            or any(ctx.suppressed(s, "rank0-guard", "MN402") for s in stmts)
            or (ctx.options.only_codes is not None and "MN402" not in ctx.options.only_codes)
            or not ctx.visible(func)
            or ctx.comm_at(func, "open") is None
        ):
            continue
        for stmt in stmts:
            if ctx.on_rank0_already(stmt) or ctx.plan.is_guarded(stmt):
                continue
            # the other ranks bind None (one `else` per run of guarded neighbours)
            names = (_bound_name(stmt),) if stmt in family.bindings else ()
            ctx.plan.guard_stmt(stmt, Guard(RANK0.key, names))
        for stmt in family.bindings:
            if ctx.plan.is_guarded(stmt):
                ctx.note(
                    stmt,
                    "rank0-guard",
                    "changed",
                    "file opened for writing on rank 0 only (the other ranks bind None), and "
                    "every write through it guarded",
                    "MN402",
                    claim=("guarded", stmt),
                )
        planned.append(family)
    return planned


def _bound_name(stmt: cst.BaseStatement) -> str:
    assert isinstance(stmt, cst.SimpleStatementLine)
    small = stmt.body[0]
    assert isinstance(small, cst.Assign) and isinstance(small.targets[0].target, cst.Name)
    return small.targets[0].target.value


# what a call must not do to be run on rank 0 alone: every rank must train, join collectives,
# read its data and make the same import changes
_EVERY_RANKS_EFFECTS = ("trains", "collective", "reads-data", "imports", "opaque")


# the statements each file's effect-based decisions put on rank 0 (withdrawn where a callee
# becomes a collective later in planning: a first-use cache's barrier, rewrites.trainers)
_EFFECT_PLANS: weakref.WeakKeyDictionary[FileContext, list[tuple[CallFact, str]]] = (
    weakref.WeakKeyDictionary()
)


def withdraw_effect_plans(
    contexts: Iterable[FileContext], collective_helpers: set[tuple[str, str]]
) -> None:
    """Take back the rank-0 guards and broadcasts planned from effects on calls of helpers
    that now join a collective (``(absolute file, function name)``): every rank must call
    them."""
    for ctx in contexts:
        planned = _EFFECT_PLANS.get(ctx, [])
        for call, how in list(planned):
            name = ctx.called_by(call)
            if ctx.effects is None or name is None or call.stmt is None:
                continue
            where = ctx.effects.defined_at(ctx.path, ctx.line(call.node), name)
            # a method counts by its own name (the helpers fetched are named so)
            if where is None or (where[0], where[1].rsplit(".", 1)[-1]) not in collective_helpers:
                continue
            planned.remove((call, how))
            if how == "guard":
                ctx.withdraw_guard(call.stmt)
            else:
                ctx.plan.replace.pop(id(call.node), None)
                ctx.plan.replaced_within.pop(id(call.node), None)
            ctx.report.withdraw_claims_on(call.stmt)
            line = ctx.line(call.stmt)

            def said_here(entry: ReportEntry, line: int = line) -> bool:
                return entry.step == "rank0-guard" and entry.line == line

            ctx.report.drop(said_here)


def _plan_effect_writes(ctx: FileContext) -> None:
    """A statement of the training flow that is one call of a function or method (of the
    project or an installed package, in any module) that writes files, through whatever it
    calls, and does nothing every rank must do (program/effects.py): rank 0's. A subprocess it
    starts is reported at the call (MN203)."""
    if ctx.effects is None:
        return
    only = ctx.options.only_codes
    for call in ctx.facts.calls:
        stmt = call.stmt
        if stmt is None or not ctx.visible(call.func):
            continue
        effects = ctx.call_effects(call)
        name = ctx.called_by(call)
        forks = effects.get("forks")
        if forks is not None and forks.via and (only is None or "MN203" in only):
            ctx.note(
                call.node,
                "fork-hazard",
                "needs-person",
                f"{name}() starts a process ({forks.describe()}): a fork of the MPI process "
                "(Open MPI can abort or hang); do it before the job starts, or with shutil / "
                "pathlib in Python",
                "MN203",
            )
        writes = effects.get("writes")
        if (
            writes is None
            or not writes.via  # a writer called right here: the guards above judge it
            or any(kind in effects for kind in _EVERY_RANKS_EFFECTS)
            or (only is not None and "MN402" not in only)
        ):
            continue
        if not call_sites.alone_on_its_line(stmt, call.node):
            _broadcast_effect_result(ctx, call, writes)
            continue
        if ctx.on_rank0_already(stmt) or ctx.plan.is_guarded(stmt) or ctx.before_comm_exists(stmt):
            continue
        if ctx.suppressed(stmt, "rank0-guard", "MN402") or ctx.reaches_collective(stmt):
            continue
        if call_sites.collective_argument(ctx, call.node) is not None:
            continue
        if _passes_a_trainer(ctx, call):
            continue  # it registers extensions: distribute_extensions places them (evaluators
            # on every rank, writers on rank 0), a guard would leave rank 0 evaluating alone
        if ctx.comm_at(call.func, "writes") is None:
            continue
        ctx.plan.guard_stmt(stmt, RANK0)
        _EFFECT_PLANS.setdefault(ctx, []).append((call, "guard"))
        ctx.note(
            stmt,
            "rank0-guard",
            "changed",
            f"{name}() writes files ({writes.describe()}): rank 0 only",
            "MN402",
            claim=("guarded", stmt),
        )


def file_writing_statement(
    ctx: FileContext, call: CallFact, *, through_converted: bool = True
) -> str | None:
    """What the statement holding ``call`` writes, when that statement does nothing but write
    files (not print, not register an extension) and nothing every rank must do: a writer
    called there (``with open(p, 'w') as f: json.dump(d, f)``, ``np.save(...)``), or one call of
    a function that writes through whatever it calls and returns nothing used (one of the
    converted files' own only with ``through_converted``). For guarding in place where the
    communicator is fetched (``rewrites.trainers``)."""
    stmt = call.stmt
    if stmt is None or call.method == "extend":
        return None
    what = _writer_name(ctx, call)
    if what is not None:
        if what == "print" or _code_of(what) != "MN402":
            return None
        found = _guardable(ctx, stmt)
        return what if found and "print" not in found else None
    effects = ctx.call_effects(call)
    writes = effects.get("writes")
    if (
        writes is None
        or any(kind in effects for kind in _EVERY_RANKS_EFFECTS)
        or not call_sites.alone_on_its_line(stmt, call.node)
        or _passes_a_trainer(ctx, call)
    ):
        return None
    name = ctx.called_by(call)
    if not through_converted and (
        ctx.effects is None
        or name is None
        or ctx.effects.resolves_outside(ctx.path, ctx.line(call.node), name) is None
    ):
        return None
    return f"{name}(): {writes.describe()}"


def _passes_a_trainer(ctx: FileContext, call: CallFact) -> bool:
    """``add_extensions(trainer, ...)``: an argument is a name the file binds to a Trainer."""
    trainers = set()
    for made in ctx.facts.calls:
        stmt = made.stmt
        if not vocab.is_trainer(made.qname) or not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and small.value is made.node:
                trainers |= {
                    t.target.value for t in small.targets if isinstance(t.target, cst.Name)
                }
    return any(
        isinstance(arg.value, cst.Name) and arg.value.value in trainers for arg in call.node.args
    )


def _assigned_result(stmt: cst.BaseStatement, node: cst.Call) -> bool:
    """``x = f(...)`` or ``x = f(...) if cond else other`` (either branch): one target name."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    small = stmt.body[0]
    if not (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
    ):
        return False
    value = small.value
    if isinstance(value, cst.IfExp):
        return node is value.body or node is value.orelse
    return node is value


def _picklable_returns(ctx: FileContext, call: CallFact) -> bool:
    """What the callee returns can be handed to the other ranks (``bcast_obj`` pickles it):
    not a file, writer or logger, a generator or a function."""
    name = ctx.called_by(call)
    if ctx.effects is None or name is None:
        return False
    returned = ctx.effects.returns_at(ctx.path, ctx.line(call.node), name)
    if not returned:
        return False
    return not any(r in _HANDLE_MAKERS or r in ("generator", "function") for r in returned)


def _broadcast_effect_result(ctx: FileContext, call: CallFact, writes: Effect) -> None:
    """``out = f(...)`` where ``f`` writes and hands back what the others use: rank 0 runs it,
    every rank gets its result (``comm.bcast_obj``), as ``helper_writes`` does for the
    project's own helpers."""
    stmt = call.stmt
    if (
        stmt is None
        or not _assigned_result(stmt, call.node)
        or not _picklable_returns(ctx, call)
        or ctx.on_rank0_already(stmt)
        or ctx.plan.is_guarded(stmt)
        or ctx.before_comm_exists(stmt)
        or id(call.node) in ctx.plan.replace
        or call.parent_qname.endswith("bcast_obj")
        or ctx.suppressed(stmt, "rank0-guard", "MN402")
        or ctx.reaches_collective(stmt)
        or call_sites.collective_argument(ctx, call.node) is not None
    ):
        return
    comm = ctx.comm_at(call.func, "writes")
    if comm is None:
        return
    ctx.plan.replace_node(call.node, helper_writes.broadcast_from_rank0(ctx, comm), stmt)
    _EFFECT_PLANS.setdefault(ctx, []).append((call, "broadcast"))
    ctx.note(
        stmt,
        "rank0-guard",
        "changed",
        f"{ctx.called_by(call)}() writes files ({writes.describe()}) and returns what it made: "
        f"rank 0 runs it, the other ranks wait for it and get its result ({comm}.bcast_obj)",
        "MN402",
    )


@rewrite("rank0-guard", order=80, fixes=("MN401", "MN402", "MN902"), code="MN806")
def plan(ctx: FileContext) -> None:
    _plan_handles(ctx)
    ctx.writing_extensions = _writing_extensions(ctx)
    for name in sorted(ctx.writing_extensions):
        node = ctx.facts.module_functions.get(name) or ctx.facts.classes.get(name)
        if isinstance(node, cst.ClassDef):
            ctx.lifts.append(Lift(name, "rank0", "a writing extension", node, ctx.module_name))
    lifted: set[int] = set()
    seen: set[int] = set()
    for call in ctx.facts.calls:
        stmt = call.stmt
        if (
            stmt is None
            or id(stmt) in seen
            or ctx.on_rank0_already(stmt)
            or ctx.before_comm_exists(stmt)
        ):
            continue
        what = _writer_name(ctx, call)
        if what is None:
            continue
        seen.add(id(stmt))
        if _guardable(ctx, stmt) is None:
            continue
        code = _code_of(what)
        # Lift the guard to an enclosing `if` made only of writers.
        target = stmt
        while True:
            block = ctx.facts.block_of.get(id(target))
            owner = ctx.facts.block_owner_stmt.get(id(block.owner)) if block else None
            if (
                isinstance(owner, cst.If)
                and id(owner) in ctx.facts.block_of  # not an elif: it has no line of its own
                and id(owner) not in ctx.facts.under_rank0
                and _guardable(ctx, owner) is not None
            ):
                target = owner
                seen.add(id(owner))
                continue
            break
        if not ctx.visible(call.func):
            param = ctx.trainer_parameter(call.func, call.receiver)
            if (
                call.method == "extend"
                and _code_of(what) == "MN401"
                and param is not None
                and ctx.options.target == "mnify"
            ):
                ctx.lift(call.func, "extensions", what, call.node, param)
                continue
            scope = ctx.outermost_scope(call.func)
            if isinstance(scope, cst.FunctionDef) and id(scope) not in lifted:
                lifted.add(id(scope))
                if _writes_only(ctx, scope):
                    ctx.lift(call.func, "rank0", what, call.node)
                elif _writes_only(ctx, scope, returns=True) and _makes_files_only(ctx, scope):
                    ctx.lift(call.func, "rank0-result", what, call.node)
                else:
                    continue
                helper_writes.report_fork_hazards(ctx, scope, f"writes ({what})")
            elif isinstance(scope, cst.ClassDef) and id(call.func) not in lifted:
                _lift_writing_method(ctx, call, scope, what)
                lifted.add(id(call.func))
            continue
        codes = {_code_of(w) for w in _guardable(ctx, target) or [what]}
        only = ctx.options.only_codes
        if only is not None and not codes <= only:
            continue
        if ctx.plan.is_guarded(target) or any(
            ctx.suppressed(target, "rank0-guard", c) for c in codes
        ):
            continue
        reached = ctx.reaches_collective(target)
        if reached is not None:
            ctx.note(
                target,
                "rank0-guard",
                "needs-person",
                f"{what} stays on every rank: it calls {reached}(), which now reaches a "
                "collective that every rank must join",
                code,
            )
            continue
        comm = ctx.comm_at(call.func, what)
        log_report = _log_report_call(ctx, call) if what == "LogReport" else None
        if log_report is not None and log_name_by_rank(log_report[0]):
            continue
        if comm is not None and log_report is not None and _log_read_after(ctx, call):
            ctx.plan.replace_node(log_report[0], _log_name_on_rank0(comm), log_report[1])
            ctx.note(
                target,
                "rank0-guard",
                "changed",
                "LogReport stays on every rank (the script reads its log back) and writes its "
                "file on rank 0 only",
                code,
            )
            continue
        if comm is None:
            ctx.note(
                target,
                "rank0-guard",
                "needs-person",
                f"{what} runs on every rank here and the communicator cannot reach it: "
                "run it on rank 0 only",
                code,
            )
            continue
        ctx.plan.guard_stmt(target, RANK0)
        ctx.note(
            target,
            "rank0-guard",
            "changed",
            f"{what} on rank 0 only",
            code,
            claim=("guarded", target),
        )
        if ctx.options.model_parallel == "channel" and what in _MODEL_SAVERS:
            ctx.note(
                target,
                "rank0-guard",
                "needs-person",
                f"model parallel: rank 0's {what} holds only rank 0's slices of the split layers; "
                "have every rank save its own file (a per-rank name, e.g. with comm.rank in it) "
                "or use mn.create_multi_node_checkpointer",
            )
    _quiet_package_extensions(ctx)
    _plan_effect_writes(ctx)
