"""Training the converter cannot reach: ``mn.distribute_trainers(comm)`` after the communicator.

When the optimizer is built inside a library-style helper that does not hand it back (or in
code that is not converted at all), no statement of the converted files can wrap it. If that
training runs a Chainer ``Trainer``, the runtime converts the Trainer when it starts running
(:mod:`mnify.runtime.trainers`); the converter then only creates the communicator as usual and
adds one explicit line after it, and says so. ChainerMN has no such function: under
``--target chainermn`` the project is left as it is and the report says why.

What the runtime cannot know is done in the helpers of the converted files, which keep their
signatures and take the communicator with ``comm = mn.current_communicator()`` as their first
statement: a preprocessing cache built on first use (``if not os.path.exists(cache):`` build and
save) would be built by every rank at once (a ``FileExistsError`` from ``makedirs``, or a reader
of a half-written file), so its ``if`` runs on rank 0 and every rank waits at ``comm.barrier()``
before reading it; the project's own writing extensions (``trainer.extend(LossHistory(...))``)
are registered on rank 0 only. A helper outside the converted files cannot be changed, and the
report says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import partial

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites import call_sites, guards
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import Guard, statement
from mnify.rewrites.report import ReportEntry
from mnify.syntax import names_in

STEP = "trainers"
CODE = "MN813"
FUNCTION = "distribute_trainers"

COVERS = (
    "at run time each chainer.training.Trainer is converted when its run() starts: the "
    "updater's optimizers become multi-node, Chainer's iterators (Serial, Multiprocess, "
    "Multithread) are rebuilt over scattered datasets, evaluators become multi-node and "
    "Chainer's writing extensions run on rank 0 only; rank 0 prints what it did"
)
DOES_NOT_COVER = (
    "not covered: training without a Trainer (a hand-written loop inside the helper), "
    "iterators of other classes (rank 0 prints them as needing a person), and files the "
    "helper writes outside extensions (the write net names them at exit); extensions that are "
    "not Chainer's stay on every rank and print on rank 0 only; run it once with "
    "`mnify run -n 2` and read rank 0's distribute_trainers lines"
)

# test functions of "the cache is missing" and the calls that build or save a cache
_EXISTS = frozenset({"os.path.exists", "os.path.isfile", "os.path.isdir"})
_WRITERS = frozenset(
    {
        "save",
        "savez",
        "savez_compressed",
        "save_npz",
        "save_hdf5",
        "dump",
        "makedirs",
        "mkdir",
        "to_csv",
        "to_pickle",
        "write_text",
        "write_bytes",
        "urlretrieve",
    }
)


# what a function that trains is called (``run_train``, ``train_model``, ``fit``)
_TRAINING_NAME = re.compile(r"train|fit", re.IGNORECASE)


def calls_training_elsewhere(ctx: FileContext) -> bool:
    """The entry point calls a function that trains and that no converted file defines: an
    installed package's (``from segkit import run_train``: its source shows a Trainer run,
    program/effects.py) or, where its source cannot be read, one named like training and not
    Chainer's."""
    if ctx.entry is None:
        return False
    if trains_through_a_package(ctx):
        return True
    return any(
        _TRAINING_NAME.search(vocab.last(c.qname))
        and not vocab.is_chainer_name(c.qname)
        and vocab.last(c.qname) not in ctx.facts.module_functions
        for c in ctx.facts.calls
    )


def trains_through_a_package(ctx: FileContext) -> bool:
    """The entry point calls a function defined outside the converted files (an installed
    package's, or a module of the project left out) whose source shows training: a Trainer run
    or an optimizer update, through whatever it calls (program/effects.py)."""
    if ctx.entry is not None and ctx.effects is not None:
        for c in ctx.facts.calls:
            if ctx.outermost_scope(c.func) is not ctx.outermost_scope(ctx.entry.func):
                continue
            effects = ctx.call_effects(c)
            name = ctx.called_by(c)
            if (
                name is not None
                and "trains" in effects
                and ctx.effects.resolves_outside(ctx.path, ctx.line(c.node), name)
            ):
                return True
    return False


def hosts(contexts: Mapping[str, FileContext]) -> list[FileContext]:
    """The files whose entry point gets the communicator and the ``distribute_trainers`` line:
    the training entry points. With several, those that call a function of the project that
    trains (builds a Trainer or optimizer), or, when the training is not in the converted
    files, every entry point."""
    entries = [ctx for ctx in contexts.values() if ctx.entry is not None]
    if len(entries) <= 1:
        return entries
    training = {
        name
        for ctx in contexts.values()
        for name, func in ctx.facts.module_functions.items()
        if any(
            c.func is not None
            and ctx.outermost_scope(c.func) is func
            and (vocab.is_trainer(c.qname) or ctx.builds_optimizer(c))
            for c in ctx.facts.calls
        )
    }
    calling = [
        ctx for ctx in entries if any(vocab.last(c.qname) in training for c in ctx.facts.calls)
    ]
    return (
        calling
        or [ctx for ctx in entries if trains_through_a_package(ctx)]
        or [ctx for ctx in entries if calls_training_elsewhere(ctx)]
        or entries
    )


def plan_host(ctx: FileContext, where: str) -> None:
    """The communicator (emitted by the communicator step, which reads
    ``ctx.distribute_trainers``) and the report entries that say what the line does."""
    entry = ctx.entry
    assert entry is not None
    assert not entry.exists  # a converted project is left as it is (driver)
    ctx.comm_needed = True
    ctx.distribute_trainers = True
    line = f"{ctx.runtime.top(FUNCTION)}({entry.comm})"
    where_line = entry.anchor or entry.top_of
    ctx.report.entries.append(
        ReportEntry(
            ctx.path,
            ctx.line(where_line) if where_line is not None else 1,
            STEP,
            "changed",
            f"`{line}` right after the communicator: {where}, so no statement here can make it "
            f"data-parallel; {COVERS}",
            CODE,
        )
    )
    ctx.report.entries.append(
        ReportEntry(
            ctx.path, 1, STEP, "needs-person", f"run-time distribution: {DOES_NOT_COVER}", CODE
        )
    )


def _is_missing_test(ctx: FileContext, test: cst.BaseExpression) -> bool:
    """``not os.path.exists(p)`` (``isfile``, ``isdir``; ``not p.exists()`` on a Path)."""
    if not isinstance(test, cst.UnaryOperation) or not isinstance(test.operator, cst.Not):
        return False
    call = test.expression
    if not isinstance(call, cst.Call):
        return False
    fact = ctx.facts.call_of(call)
    if fact is None:
        return False
    return fact.qname in _EXISTS or (fact.method == "exists" and not call.args)


def _inside(ctx: FileContext, stmt: cst.BaseStatement | None, outer: cst.If) -> bool:
    while stmt is not None:
        if stmt is outer:
            return True
        stmt = ctx.facts.parent_statement(stmt)
    return False


def _writes(ctx: FileContext, block: cst.If) -> cst.FunctionDef | None | bool:
    """The function holding ``block`` when its body builds and saves something, None at module
    level, False when it saves nothing."""
    found: cst.FunctionDef | None | bool = False
    for call in ctx.facts.calls:
        if not _inside(ctx, call.stmt, block) or call.stmt is block:
            continue
        name = vocab.last(call.qname)
        opens = name == "open" and any(
            isinstance(a.value, cst.SimpleString) and set(a.value.value) & set("wax")
            for a in call.node.args[1:2]
        )
        if name in _WRITERS or opens:
            found = call.func
            break
    return found


def plan_helpers(
    contexts: Mapping[str, FileContext],
    ctx: FileContext,
    entry_func: cst.FunctionDef | None,
    collective_helpers: set[tuple[str, str]] | None = None,
    flow: set[tuple[str, str]] | None = None,
) -> set[str]:
    """What rank 0 alone must do in this file's helpers, which keep their signatures and take
    the communicator with ``comm = mn.current_communicator()`` as their first statement: build
    first-use caches (every rank waits, then reads), and call the project's writing extensions
    and helpers. Returns the helpers whose every print now runs on rank 0 only; adds to
    ``collective_helpers`` (absolute file, name) the helpers that now wait at a barrier.
    ``flow`` (:func:`training_flow`) holds the functions whose file writes are put on rank 0
    where they are."""
    fetched: dict[int, cst.FunctionDef] = {}
    _plan_caches(ctx, entry_func, fetched)
    if collective_helpers is not None:
        where = os.path.abspath(ctx.path)
        collective_helpers.update((where, func.name.value) for func in fetched.values())
    _plan_rank0_calls(contexts, ctx, entry_func, fetched)
    if flow:
        _plan_rank0_writes(ctx, entry_func, fetched, flow)
    for func in fetched.values():
        _fetch_at_top(ctx, func)
    return _printing_only_on_rank0(ctx)


def _fetch_at_top(ctx: FileContext, func: cst.FunctionDef) -> None:
    if not isinstance(func.body, cst.IndentedBlock) or not func.body.body:
        return
    stmts = list(func.body.body)
    first = 1 if len(stmts) > 1 and _is_docstring(stmts[0]) else 0
    fetch = f"comm = {ctx.runtime.top('current_communicator')}()\n"
    ctx.plan.insert_before(stmts[first], [statement(fetch)], first=True)


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _helper_of(
    ctx: FileContext, func: cst.FunctionDef | None, entry_func: cst.FunctionDef | None
) -> cst.FunctionDef | None:
    """The module-level helper around ``func`` that may fetch the communicator (not the entry
    point, not a method, not one that already has a ``comm`` of its own)."""
    scope = ctx.outermost_scope(func)
    if not isinstance(scope, cst.FunctionDef) or scope is entry_func:
        return None
    if ctx.facts.func_class.get(id(scope)) is not None:
        return None
    return scope


def _plan_rank0_calls(
    contexts: Mapping[str, FileContext],
    ctx: FileContext,
    entry_func: cst.FunctionDef | None,
    fetched: dict[int, cst.FunctionDef],
) -> None:
    """``trainer.extend(LossHistory(...))`` in a helper, where the project's ``LossHistory``
    writes files: on rank 0 only (the rank-0 guard could not reach it: no communicator)."""
    lifts = [lift for c in contexts.values() for lift in c.lifts if lift.kind == "rank0"]
    for call in ctx.facts.calls:
        lift = next((lift for lift in lifts if call_sites.matches(ctx, call, lift)), None)
        if lift is None or ctx.visible(call.func):
            continue
        helper = _helper_of(ctx, call.func, entry_func)
        stmt = call.stmt
        if helper is None or not _is_call_statement(ctx, stmt, call.node):
            continue
        assert stmt is not None
        if ctx.on_rank0_already(stmt) or ctx.plan.is_guarded(stmt) or ctx.reaches_collective(stmt):
            continue
        if ctx.suppressed(stmt, STEP) or (
            "comm" in names_in([helper]) and id(helper) not in fetched
        ):
            continue
        line = ctx.line(call.node)
        ctx.report.drop(partial(_guard_note_on_line, line=line))
        fetched[id(helper)] = helper
        ctx.plan.guard_stmt(stmt, Guard("rank0"))
        ctx.note(
            stmt,
            STEP,
            "changed",
            f"{lift.name}() writes ({lift.label}): called on rank 0 only in "
            f"{helper.name.value}(), which takes the communicator with "
            "mn.current_communicator()",
            CODE,
            claim=("guarded", stmt),
        )


def training_flow(hosts: list[FileContext]) -> set[tuple[str, str]]:
    """The functions and methods of the converted files that the entry points call, through any
    number of calls, as ``(absolute path, key)`` (``program.effects``'s keys: ``"persist"``,
    ``"Pipeline.persist"``). Only their code is sure to run after the communicator exists."""
    roots = [
        (ctx.path, ctx.entry.func.name.value if ctx.entry.func is not None else "<module>")
        for ctx in hosts
        if ctx.entry is not None
    ]
    effects = next((ctx.effects for ctx in hosts if ctx.effects is not None), None)
    return effects.reached_from(roots) if effects is not None else set()


def _flow_key(ctx: FileContext, func: cst.FunctionDef) -> str | None:
    """``program.effects``'s key of the top-level function or method holding ``func``."""
    scope = ctx.outermost_scope(func)
    if isinstance(scope, cst.FunctionDef):
        return scope.name.value
    if isinstance(scope, cst.ClassDef):
        method: object = func
        while isinstance(method, cst.FunctionDef):
            if ctx.facts.func_class.get(id(method)) is scope:
                return f"{scope.name.value}.{method.name.value}"
            method = ctx.facts.func_parent.get(id(method))
    return None


def _plan_rank0_writes(
    ctx: FileContext,
    entry_func: cst.FunctionDef | None,
    fetched: dict[int, cst.FunctionDef],
    flow: set[tuple[str, str]],
) -> None:
    """A statement of a helper or method of the training flow that only writes files (``with
    open(path, 'w') as f: json.dump(vocab, f)`` in a pipeline's ``persist()``, a call of a
    package's function that writes through whatever it calls): rank 0's, where it is, with the
    communicator from ``mn.current_communicator()``; no signature changes, and nothing every
    rank must join is guarded (``guards.file_writing_statement``). Code the entry points never
    reach (a data-preparation script's helpers) may run where no communicator exists: left."""
    where = os.path.abspath(ctx.path)
    for call in ctx.facts.calls:
        stmt, func = call.stmt, call.func
        if stmt is None or func is None or ctx.visible(func):
            continue
        if entry_func is not None and ctx.outermost_scope(func) is entry_func:
            continue
        if (where, _flow_key(ctx, func) or "") not in flow:
            continue
        # a function of the converted files has its own writes guarded where they are
        what = guards.file_writing_statement(ctx, call, through_converted=False)
        if what is None:
            continue
        if (
            ctx.on_rank0_already(stmt)
            or ctx.under_rank0_guard(stmt)
            or ctx.reaches_collective(stmt)
            or ctx.suppressed(stmt, STEP)
            or ctx.suppressed(stmt, "rank0-guard", "MN402")
            or ("comm" in names_in([func]) and id(func) not in fetched)
        ):
            continue
        fetched[id(func)] = func
        ctx.report.drop(partial(_guard_note_on_line, line=ctx.line(stmt)))
        ctx.plan.guard_stmt(stmt, Guard("rank0"))
        ctx.note(
            stmt,
            STEP,
            "changed",
            f"writes a file ({what}): rank 0 only, in {func.name.value}(), which takes the "
            "communicator with mn.current_communicator()",
            "MN402",
            claim=("guarded", stmt),
        )


def _is_call_statement(ctx: FileContext, stmt: cst.BaseStatement | None, call: cst.Call) -> bool:
    """``stmt`` is one expression statement whose value is ``call`` or a call that takes it
    (``trainer.extend(call, trigger=...)``): nothing it binds is missing on the other ranks."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    expr = stmt.body[0]
    if not isinstance(expr, cst.Expr) or not isinstance(expr.value, cst.Call):
        return False
    outer = expr.value
    return outer is call or any(arg.value is call for arg in outer.args)


def _plan_caches(
    ctx: FileContext, entry_func: cst.FunctionDef | None, fetched: dict[int, cst.FunctionDef]
) -> None:
    """Rank 0 builds each first-use cache in this file's helpers; every rank waits, then reads."""
    ifs = [
        stmt
        for stmt in ctx.facts.stmt_order
        if isinstance(stmt, cst.If) and _is_missing_test(ctx, stmt.test)
    ]
    for block in ifs:
        func = _writes(ctx, block)
        if func is False or ctx.on_rank0_already(block) or ctx.plan.is_guarded(block):
            continue
        if ctx.suppressed(block, STEP):
            continue
        label = f"the cache built under `if {ctx.code(block.test).strip()}:`"
        if not isinstance(func, cst.FunctionDef) or (
            entry_func is not None and ctx.outermost_scope(func) is entry_func
        ):
            if func is None:
                ctx.note(
                    block,
                    STEP,
                    "needs-person",
                    f"{label} runs at import, before any communicator exists: every rank "
                    "builds it; build it on rank 0 and wait for it",
                    CODE,
                )
            continue
        if "comm" in names_in([func]) and id(func) not in fetched:
            ctx.note(
                block,
                STEP,
                "needs-person",
                f"{label} is built by every rank at once, and {func.name.value}() already uses "
                "the name comm: build it on rank 0 and make the others wait before reading it",
                CODE,
            )
            continue
        fetched[id(func)] = func
        ctx.plan.guard_stmt(block, Guard("cache"))
        ctx.plan.insert_after(block, [statement("comm.barrier()\n")])
        ctx.note(
            block,
            STEP,
            "changed",
            f"{label} in {func.name.value}(): rank 0 builds it while the others wait at "
            "comm.barrier(); then every rank reads it (the communicator comes from "
            "mn.current_communicator(), the helper keeps its signature)",
            CODE,
            claim=("guarded", block),
        )


def _printing_only_on_rank0(ctx: FileContext) -> set[str]:
    quiet: set[str] = set()
    for name, func in ctx.facts.module_functions.items():
        prints = [
            c
            for c in ctx.facts.calls
            if c.func is not None and ctx.outermost_scope(c.func) is func and c.qname == "print"
        ]
        if prints and all(_under_guard(ctx, c.stmt) for c in prints):
            quiet.add(name)
    return quiet


def _under_guard(ctx: FileContext, stmt: cst.BaseStatement | None) -> bool:
    while stmt is not None:
        if ctx.plan.is_guarded(stmt):
            return True
        stmt = ctx.facts.parent_statement(stmt)
    return False


def drop_answered_print_notes(ctx: FileContext, quiet: set[str]) -> None:
    """The rank-0 guard's note that a helper prints on every rank, for helpers whose prints
    are now inside a cache that rank 0 builds."""
    ctx.report.drop(
        lambda e: (
            e.severity == "needs-person"
            and e.step == "rank0-guard"
            and any(e.message.startswith(f"{name} writes (print) ") for name in quiet)
        )
    )


def report_unreachable_caches(ctx: FileContext) -> None:
    """Training and its caches in code that is not converted: nothing here can change them."""
    ctx.report.entries.append(
        ReportEntry(
            ctx.path,
            1,
            STEP,
            "needs-person",
            "the training code is outside the converted files: a cache it builds on first use "
            "(a path checked, then built and saved) is built by every rank at once; build it "
            "once before the run (one process), or convert that code too",
            CODE,
        )
    )


def _guard_note_on_line(entry: ReportEntry, line: int) -> bool:
    """The rank-0 guard's needs-a-person note at ``line`` (a guard now planned answers it)."""
    return entry.step == "rank0-guard" and entry.severity == "needs-person" and entry.line == line
