"""What a helper or a model class cannot do without ``comm`` happens where the entry point
calls it (docs/design.md §0: no rewrite changes a function or class signature).

ChainerMN's own answer, applied across the files of a project: a model class holding
BatchNormalization is converted where it is built, ``create_mnbn_model(Net(...), comm)``; an
optimizer made by ``make_optimizer(model)`` is wrapped where that is called,
``create_multi_node_optimizer(make_optimizer(model), comm)``; a helper that only writes files
runs on rank 0, its call guarded. Rewrites record such requests as ``Lift``s while planning;
this pass, run once over the whole project, finds the calls. A lift that reaches a class or
helper called from another class or helper moves up to that one (a ``Net`` that builds a
``Block`` with BatchNormalization is wrapped where ``Net`` is built). What cannot be reached
from the entry point is reported for a person.
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites import helper_writes
from mnify.rewrites.context import FileContext, Lift, LiftKind
from mnify.rewrites.edits import Guard, statement
from mnify.rewrites.wrapping import names_module, wrap_call

# lifts done by guarding (or broadcasting) a call, not by wrapping its value
_NOT_WRAPPED: frozenset[LiftKind] = frozenset(
    {"rank0", "rank0-result", "rank0-method", "extensions"}
)
_WRAPPERS: dict[LiftKind, tuple[str, str]] = {
    # kind -> (runtime name, how the report says it)
    "optimizer": ("create_multi_node_optimizer", "gradients averaged across ranks"),
    "mnbn": ("links.create_mnbn_model", "BatchNormalization synchronised across ranks"),
    "channel-parallel": ("links.create_channel_parallel_model", "convolutions split over ranks"),
    "spatial-parallel": (
        "links.create_spatial_parallel_model",
        "images split into slabs of rows over ranks",
    ),
}


def matches(ctx: FileContext, call: CallFact, lift: Lift) -> bool:
    """Whether ``call`` calls the lifted function/class (by its resolved name)."""
    bare = call.qname.lstrip(".")
    if not bare:
        return False
    if lift.module == ctx.module_name and bare == lift.name:
        return True
    qualified = f"{lift.module}.{lift.name}"
    return bare == qualified or bare.endswith("." + qualified)


def _already_wrapped(ctx: FileContext, call: CallFact, kind: LiftKind) -> bool:
    parent = call.parent_qname
    if kind == "optimizer":
        return vocab.is_multi_node_optimizer_factory(parent)
    if kind == "mnbn":
        return vocab.is_mnbn_factory(parent)
    if kind == "channel-parallel":
        return vocab.is_runtime_name(parent, "create_channel_parallel_model")
    if kind == "spatial-parallel":
        return vocab.is_runtime_name(parent, "create_spatial_parallel_model")
    return False


def _subclass_lifts(ctx: FileContext, lifts: list[Lift]) -> list[Lift]:
    """Subclasses (in this file) of lifted classes inherit what their base needs."""
    found = []
    for name, bases in ctx.facts.class_bases.items():
        for base in bases:
            bare = base.lstrip(".")
            for lift in lifts:
                if lift.kind in _NOT_WRAPPED:
                    continue
                local = lift.module == ctx.module_name and bare == lift.name
                if local or bare.endswith("." + lift.name) or bare == f"{lift.module}.{lift.name}":
                    cls = ctx.facts.classes[name]
                    found.append(Lift(name, lift.kind, lift.label, cls, ctx.module_name))
    return found


def alone_on_its_line(stmt: cst.BaseStatement | None, node: cst.Call) -> bool:
    """``node`` is the whole statement: guarding it hides no value from the other ranks."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and stmt.body[0].value is node
    )


def _guard_target(ctx: FileContext, call: CallFact, lift: Lift) -> cst.Call | None:
    """The call whose statement a rank-0 lift guards: ``helper(...)`` alone on its line, or
    ``trainer.extend(helper(...), ...)`` for an extension (or a factory of one)."""
    parent = call.parent_call
    if parent is not None and parent.args and parent.args[0].value is call.node:
        extend = ctx.facts.call_of(parent)
        if extend is not None and extend.method == "extend":
            return parent
    return call.node


def _extended_by_name(ctx: FileContext, lifts: list[Lift]) -> list[tuple[CallFact, Lift]]:
    """``trainer.extend(save_samples, ...)``: an extension function passed by name."""
    found = []
    for call in ctx.facts.calls:
        if call.method != "extend" or not call.node.args:
            continue
        arg = call.node.args[0].value
        if not isinstance(arg, cst.Name):
            continue
        imported = ctx.facts.imported_modules.get(arg.value, "").lstrip(".")
        for lift in lifts:
            if lift.kind != "rank0":
                continue
            local = lift.module == ctx.module_name and arg.value == lift.name
            qualified = f"{lift.module}.{lift.name}"
            if local or imported == qualified or imported.endswith("." + qualified):
                found.append((call, lift))
    return found


def plan_project(contexts: Mapping[str, FileContext]) -> None:
    """Carry every lift to the calls that can see the communicator (see the module docs)."""
    lifts: list[Lift] = [lift for ctx in contexts.values() for lift in ctx.lifts]
    known = {(lift.module, lift.name, lift.kind) for lift in lifts}
    for _ in range(8):  # classes inside classes, helpers calling helpers: a few levels
        grown: list[Lift] = []
        for ctx in contexts.values():
            for lift in _subclass_lifts(ctx, lifts):
                if (lift.module, lift.name, lift.kind) not in known:
                    known.add((lift.module, lift.name, lift.kind))
                    grown.append(lift)
            for call in ctx.facts.calls:
                for lift in lifts:
                    if lift.kind in _NOT_WRAPPED or not matches(ctx, call, lift):
                        continue
                    if ctx.visible(call.func):
                        continue
                    scope = ctx.outermost_scope(call.func)
                    if scope is None:
                        continue
                    if isinstance(scope, cst.FunctionDef) and not (
                        scope is call.func and ctx.returns_value_of(scope, call.node)
                    ):
                        continue  # the helper does not hand the object back: nothing to wrap
                    key = (ctx.module_name, scope.name.value, lift.kind)
                    if key not in known:
                        known.add(key)
                        grown.append(
                            Lift(scope.name.value, lift.kind, lift.label, call.node, key[0])
                        )
        if not grown:
            break
        lifts.extend(grown)
    definitions = helper_writes.method_definitions(contexts.values())
    for ctx in contexts.values():
        _apply(ctx, lifts)
        helper_writes.guard_method_calls(ctx, lifts, definitions)
    has_batchnorm = any(lift.kind == "mnbn" for lift in lifts) or any(
        vocab.is_batch_normalization(c.qname) for ctx in contexts.values() for c in ctx.facts.calls
    )
    for ctx in contexts.values():
        if ctx.options.data_parallel:
            _optimizers_built_by_name(ctx)
            if has_batchnorm:
                _models_built_elsewhere(ctx, lifts)


def _from_optimizer_table(ctx: FileContext, call: CallFact) -> bool:
    """``OPTIMIZERS[name](cfg)``: a call of an entry of a dict (of lambdas or functions)
    whose values build optimizers."""
    func = call.node.func
    if not isinstance(func, cst.Subscript) or not isinstance(func.value, cst.Name):
        return False
    tables = [
        a.stmt for a in ctx.facts.assigns_of(func.value.value) if isinstance(a.value, cst.Dict)
    ]
    return any(
        ctx.builds_optimizer(c) and c.stmt is table for c in ctx.facts.calls for table in tables
    )


def _optimizers_built_by_name(ctx: FileContext) -> None:
    """``build(config['optimizer'], chainer.optimizers)``: a helper handed Chainer's optimizer
    module returns an optimizer it built by name; it is wrapped where the entry point calls it."""
    name = ctx.spell.top("create_multi_node_optimizer")
    for call in ctx.facts.calls:
        if not ctx.visible(call.func) or call.stmt is None:
            continue
        if not any(
            names_module(ctx, a.value, vocab.OPTIMIZERS_MODULE) for a in call.node.args
        ) and not _from_optimizer_table(ctx, call):
            continue
        if vocab.is_multi_node_optimizer_factory(call.parent_qname) or ctx.suppressed(
            call.node, "optimizer"
        ):
            continue
        comm = ctx.comm_at(call.func, "optimizer")
        if comm is None:
            continue
        ctx.use_runtime()
        ctx.plan.replace_node(call.node, wrap_call(name, comm), call.stmt)
        ctx.note(
            call.node,
            "optimizer",
            "changed",
            f"an optimizer built by name: {name}({ctx.code(call.node.func)}(...), {comm})",
        )


def _models_built_elsewhere(ctx: FileContext, lifts: list[Lift]) -> None:
    """Models the entry point gets from a config, ``getattr(module, name)(...)`` or a helper that
    returns several (``gen, dis = load_models(config)``), in a project that holds
    BatchNormalization: converted right after they are bound, ``gen = create_mnbn_model(gen,
    comm)`` (harmless on a model without BatchNormalization). A model is what an optimizer is set
    up with, or what a helper that builds an optimizer is given."""
    optimizer_helpers = {lift.name for lift in lifts if lift.kind == "optimizer"}
    models: set[str] = set()
    for call in ctx.facts.calls:
        if not ctx.visible(call.func) or not call.node.args:
            continue
        first = call.node.args[0].value
        if not isinstance(first, cst.Name):
            continue
        bare = call.qname.lstrip(".")
        if call.method == "setup" or vocab.last(bare) in optimizer_helpers:
            models.add(first.value)
    wrap = ctx.spell.links("create_mnbn_model")
    pending = sorted(models)
    while pending:
        name = pending.pop(0)
        assigns = [a for a in ctx.facts.assigns_of(name) if ctx.visible(a.func)]
        if len(assigns) != 1 or assigns[0].stmt is None:
            continue
        fact = ctx.facts.call_of(assigns[0].value)
        if fact is None:
            continue  # bound to a name or an expression we do not know: leave it
        inner = fact.node.args[0].value if fact.node.args else None
        if vocab.is_chainer_name(fact.qname) and isinstance(inner, cst.Name):
            pending.append(inner.value)  # model = L.Classifier(predictor): look at predictor
            continue
        held = [
            inner.value
            for _ in [0]
            if isinstance(inner, cst.Name)
            and any(ctx.facts.call_of(b.value) for b in ctx.facts.assigns_of(inner.value))
        ]
        if held:
            # train_model = Wrapper(model): a copy of train_model would leave `model` (still
            # used for evaluation and snapshots) untrained; convert what it wraps instead
            pending.extend(held)
            continue
        if _already_wrapped(ctx, fact, "mnbn") or vocab.is_mnbn_factory(fact.qname):
            continue
        if any(matches(ctx, fact, lift) for lift in lifts if lift.kind == "mnbn"):
            continue  # its construction is wrapped already
        if vocab.is_chainer_name(fact.qname) and not vocab.is_library_bn_model(fact.qname):
            # a Chainer link: only a wrapper (L.Classifier(build(...))) of a model built elsewhere
            inner = fact.node.args[0].value if fact.node.args else None
            inner_fact = ctx.facts.call_of(inner)
            if (
                inner_fact is None
                or vocab.is_chainer_name(inner_fact.qname)
                or vocab.is_mnbn_factory(inner_fact.qname)
            ):
                continue
            if any(matches(ctx, inner_fact, lift) for lift in lifts if lift.kind == "mnbn"):
                continue  # L.Classifier(Net()): Net() itself is converted where it is built
        if ctx.plan.nodes.get(id(fact.node)) is not None or ctx.suppressed(fact.node, "batchnorm"):
            continue
        comm = ctx.comm_at(assigns[0].func, "create_mnbn_model")
        if comm is None:
            continue
        ctx.use_runtime()
        ctx.plan.insert_after(assigns[0].stmt, [statement(f"{name} = {wrap}({name}, {comm})\n")])
        ctx.note(
            fact.node,
            "batchnorm",
            "changed",
            f"{name} is built where mnify cannot see its class (by name or by a helper): "
            f"{name} = {wrap}({name}, {comm}) converts its BatchNormalization",
        )


def _apply(ctx: FileContext, lifts: list[Lift]) -> None:
    done: set[tuple[int, LiftKind]] = set()
    for call in ctx.facts.calls:
        for lift in lifts:
            if not matches(ctx, call, lift) or (id(call.node), lift.kind) in done:
                continue
            done.add((id(call.node), lift.kind))
            if lift.kind == "loop-data":
                continue  # loops.plan_project scatters the arrays the call hands over
            if not ctx.visible(call.func):
                if lift.kind == "extensions":
                    ctx.note(
                        call.node,
                        "evaluator",
                        "needs-person",
                        f"{lift.name}() registers {lift.label} on the trainer it is given and is "
                        "called where the communicator is not in scope: call "
                        "distribute_extensions(trainer, comm) after it",
                    )
                    continue
                if lift.kind in ("rank0", "rank0-result") and ctx.outermost_scope(call.func):
                    ctx.note(
                        call.node,
                        "rank0-guard",
                        "needs-person",
                        f"{lift.name}() writes ({lift.label}) on every rank and is called where "
                        "the communicator is not in scope: call it on rank 0 only",
                    )
                continue
            if lift.kind == "rank0-method":
                continue  # found by name: helper_writes.guard_method_calls
            if lift.kind == "rank0-result" and helper_writes.broadcast_result(ctx, call, lift):
                continue
            if lift.kind in ("rank0", "rank0-result"):
                target = _guard_target(ctx, call, lift)
                if target is not None:
                    _guard_call(ctx, call, target, lift)
            elif lift.kind == "extensions":
                _distribute_after(ctx, call, lift)
            else:
                _wrap(ctx, call, lift)
    for extend, lift in _extended_by_name(ctx, lifts):
        if ctx.visible(extend.func):
            _guard_call(ctx, extend, extend.node, lift)


def _wrap(ctx: FileContext, call: CallFact, lift: Lift) -> None:
    if _already_wrapped(ctx, call, lift.kind) or call.stmt is None:
        return
    step = "optimizer" if lift.kind == "optimizer" else "batchnorm"
    if lift.kind in ("channel-parallel", "spatial-parallel"):
        step = "model-parallel"
    if ctx.suppressed(call.node, step):
        return
    comm = ctx.comm_at(call.func, lift.label)
    if comm is None:
        return
    runtime, what = _WRAPPERS[lift.kind]
    name = ctx.runtime.top(runtime)
    ctx.plan.replace_node(call.node, wrap_call(name, comm), call.stmt)
    ctx.note(
        call.node,
        step,
        "changed",
        f"{lift.name}(...) holds {lift.label}: built as {name}({lift.name}(...), {comm}) ({what})",
    )


def _trainer_argument(call: cst.Call, param: tuple[int, str]) -> cst.BaseExpression | None:
    position, name = param
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[position].value if 0 <= position < len(positional) else None


def _distribute_after(ctx: FileContext, call: CallFact, lift: Lift) -> None:
    """``add_extensions(trainer, ...)`` registered an evaluator or writers without ``comm``:
    ``mn.distribute_extensions(trainer, comm)`` right after the call converts them."""
    stmt = call.stmt
    trainer = _trainer_argument(call.node, lift.param) if lift.param is not None else None
    block = ctx.facts.block_of.get(id(stmt)) if stmt is not None else None
    if stmt is None or block is None or not isinstance(trainer, (cst.Name, cst.Attribute)):
        ctx.note(
            call.node,
            "evaluator",
            "needs-person",
            f"{lift.name}() registers {lift.label} on a trainer mnify cannot name here: call "
            "distribute_extensions(trainer, comm) after it",
        )
        return
    comm = ctx.comm_at(call.func, lift.label)
    if comm is None or ctx.suppressed(stmt, "evaluator") or ctx.suppressed(stmt, "rank0-guard"):
        return
    name = ctx.runtime.top("distribute_extensions")
    code = f"{name}({ctx.code(trainer)}, {comm})"
    if any(ctx.code(s).strip() == code for s in block.body):
        return  # converted before
    ctx.use_runtime()
    ctx.plan.insert_after(stmt, [statement(code + "\n")])
    ctx.note(
        call.node,
        "evaluator",
        "changed",
        f"{lift.name}() registers {lift.label} without the communicator: {code} after it makes "
        "its evaluators multi-node and keeps its writers on rank 0",
    )


def collective_argument(ctx: FileContext, call: cst.Call) -> str | None:
    """An evaluator argument: once converted, calling it is a collective, and a writing helper
    handed one may call it (``report(evaluator, epoch)``), so its call cannot run on rank 0
    alone. (Optimizers and communicators are safe to hand over: a writes-only helper never
    updates one or calls its collectives; saving them is what checkpoint helpers do.)"""
    for arg in call.args:
        value = arg.value
        made = [ctx.facts.call_of(value)]
        if isinstance(value, cst.Name):
            made += [ctx.facts.call_of(a.value) for a in ctx.facts.assigns_of(value.value)]
        for fact in made:
            if fact is None:
                continue
            q = fact.qname
            if (
                vocab.is_evaluator(q)
                or vocab.is_evaluator_class(q)
                or vocab.is_multi_node_evaluator_factory(q)
            ):
                return ctx.code(value)
    return None


def _guard_call(ctx: FileContext, call: CallFact, target: cst.Call, lift: Lift) -> None:
    stmt = call.stmt
    assert stmt is not None
    handed = collective_argument(ctx, call.node)
    if handed is not None:
        ctx.note(
            call.node,
            "rank0-guard",
            "needs-person",
            f"{lift.name} writes ({lift.label}) on every rank, but it is handed {handed}, an "
            "evaluator: calling it is a collective every rank must join, so split the writing "
            "out and guard only it",
        )
        return
    reached = ctx.reaches_collective(stmt)
    if not alone_on_its_line(stmt, target) or reached is not None:
        ctx.note(
            call.node,
            "rank0-guard",
            "needs-person",
            f"{lift.name} writes ({lift.label}) on every rank; this statement cannot simply be "
            "put on rank 0 (its value is used, or it reaches a collective): split the writing out",
        )
        return
    if ctx.on_rank0_already(stmt) or ctx.plan.is_guarded(stmt) or ctx.before_comm_exists(stmt):
        return
    code = "MN401" if target is not call.node or lift.name in ctx.writing_extensions else "MN402"
    if ctx.suppressed(stmt, "rank0-guard", code):
        return
    if ctx.comm_at(call.func, lift.label) is None:
        return
    ctx.plan.guard_stmt(stmt, Guard("rank0"))
    ctx.note(
        stmt,
        "rank0-guard",
        "changed",
        f"{lift.name} writes ({lift.label}): rank 0 only",
        code,
        claim=("guarded", stmt),
    )
