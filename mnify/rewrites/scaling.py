"""docs/design.md §1, step "scaling": what N ranks do to the batch and the learning rate.

Weak scaling (ChainerMN's default) leaves the per-rank batch as written, so N ranks train with
N times the batch and an epoch takes 1/N of the iterations; ``--scaling strong`` divides the
training iterators' batch size by ``comm.size`` (after a clear error when it does not divide),
keeping the global batch. Either way the report states the per-rank and the global batch, and the
script's own "Minibatch-size" print shows both. With weak scaling, schedules counted in
iterations (``(N, 'iteration')`` triggers and stop conditions, learning-rate shifts by
iteration) now see N times the examples per step; each is reported.

``--scale-lr linear`` (never a default) applies the linear scaling rule: the learning rate
(``lr``; ``alpha`` for the Adam family) times ``comm.size``, reached by a linear warm-up over
``--warmup-epochs`` epochs (Goyal et al.). A Trainer script gets ``mn.LinearWarmup``; under
``--target chainermn``, which has no such extension, Chainer's own ``LinearShift`` per optimizer;
a custom loop is left to a person with the recipe.

A loss normalised by a count taken from the batch (``F.sum(loss) / n_positive`` in
hard-negative mining) averages wrongly over ranks: it is listed for a person with the
``comm``-aware alternative.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites import global_data
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression, statement
from mnify.rewrites.iterators import is_training_iterator, iterator_calls
from mnify.rewrites.registry import rewrite

_STEP = "scaling"
_SIMPLE = (cst.Name, cst.Attribute, cst.Integer, cst.Subscript)


@dataclass(eq=False)
class _Batch:
    """A training iterator's batch argument."""

    call: CallFact
    arg: cst.Arg
    code: str  # as written (before any division)
    simple: bool  # a name, attribute, subscript or literal


def _batch_arg(call: cst.Call) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "batch_size":
            return arg
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[1] if len(positional) > 1 else None


@rewrite(_STEP, order=50, code="MN809")
def plan(ctx: FileContext) -> None:
    options = ctx.options
    if not options.data_parallel:
        if options.scaling == "strong":
            ctx.note(None, _STEP, "info", "--scaling strong ignored under model parallelism")
        if options.scale_lr != "none":
            ctx.note(None, _STEP, "info", "--scale-lr ignored under model parallelism")
        return
    batches = _training_batches(ctx)
    for batch in batches:
        _batch_sizes(ctx, batch)
    _minibatch_prints(ctx, batches)
    if options.scaling == "weak":
        _iteration_schedules(ctx)
    _learning_rate(ctx)
    _count_normalised_losses(ctx)


# ----------------------------------------------------------------------- per-rank and global
def _training_batches(ctx: FileContext) -> list[_Batch]:
    found = []
    for call in iterator_calls(ctx):
        if not is_training_iterator(call.node) or call.stmt is None:
            continue
        arg = _batch_arg(call.node)
        if arg is None:
            if ctx.options.scaling == "strong":
                ctx.note(
                    call.node, _STEP, "needs-person", "batch size not found: divide it by hand"
                )
            continue
        found.append(_Batch(call, arg, ctx.code(arg.value), isinstance(arg.value, _SIMPLE)))
    return found


def _converted(code: str) -> bool:
    """A batch expression mnify (or a person) already divided by the number of ranks."""
    return "comm" in code and ".size" in code


def _batch_sizes(ctx: FileContext, batch: _Batch) -> None:
    """Report the per-rank and the global batch; with strong scaling, divide the batch."""
    call, code = batch.call, batch.code
    if _converted(code) or global_data.replaces(ctx, call):
        return  # converted before, or the global batch of --data global (step global-data)
    operand = code if batch.simple else f"({code})"
    if ctx.options.scaling == "weak":
        ctx.note(
            call.node,
            _STEP,
            "info",
            f"weak scaling: per-rank batch {code}, global batch {operand} * comm.size (N ranks "
            "train with N times the batch of the original run; an epoch takes 1/N of the "
            "iterations)",
            facts=(("per_rank_batch", code), ("global_batch", f"{operand} * comm.size")),
        )
        return
    if ctx.suppressed(call.node, _STEP):
        return
    assert call.stmt is not None
    comm = ctx.comm_at(call.func, "batch size")
    if comm is None:
        ctx.note(call.node, _STEP, "needs-person", "divide the batch size by comm.size")
        return
    check = statement(
        f"if {operand} % {comm}.size != 0:\n"
        "    raise ValueError(\n"
        f"        {ctx.q('--scaling strong: global batch size %d does not divide by %d ranks')}\n"
        f"        % ({operand}, {comm}.size)\n"
        "    )\n"
    )
    ctx.plan.insert_before(call.stmt, [check])
    value = f"{operand} // {comm}.size"

    def fn(node: cst.CSTNode, value: str = value) -> cst.CSTNode:
        assert isinstance(node, cst.Arg)
        return node.with_changes(value=expression(value))

    ctx.plan.replace_node(batch.arg, fn, call.stmt)
    ctx.note(
        call.node,
        _STEP,
        "changed",
        f"strong scaling: per-rank batch {value}, global batch {code} as written",
        facts=(("per_rank_batch", value), ("global_batch", code)),
    )


# ----------------------------------------------------------------------- Minibatch-size print
def _minibatch_prints(ctx: FileContext, batches: list[_Batch]) -> None:
    """``print('# Minibatch-size: {}'.format(args.batchsize))`` also shows the other figure."""
    codes = {b.code: b for b in batches if b.simple and not isinstance(b.arg.value, cst.Integer)}
    if not codes:
        return
    for call in ctx.facts.calls:
        if call.qname != vocab.BUILTIN_PRINT or call.stmt is None:
            continue
        shown = _mentioned(call.node, set(codes))
        if shown is None or "comm" in ctx.code(call.node) or _in_loop(ctx, call.stmt):
            continue
        if not ctx.visible(call.func) or not _after_communicator(ctx, call.stmt):
            continue
        if ctx.suppressed(call.node, _STEP):
            continue
        comm = ctx.comm_at(call.func, "batch size")
        if comm is None:
            continue
        if ctx.options.scaling == "weak":
            extra = f"{ctx.q('(per rank; global: {})')}.format({shown} * {comm}.size)"
            what = f"global batch {shown} * {comm}.size"
        else:
            extra = f"{ctx.q('(global; per rank: {})')}.format({shown} // {comm}.size)"
            what = f"per-rank batch {shown} // {comm}.size"
        width = len(ctx.code(call.node)) + len(extra) + 2 + _indent_of(ctx, call.stmt)
        ctx.plan.replace_node(call.node, _append_positional(extra, width > 79), call.stmt)
        ctx.note(call.node, _STEP, "changed", f"the batch-size print also shows the {what}")


def _mentioned(node: cst.Call, codes: set[str]) -> str | None:
    """Which of ``codes`` (batch expressions) appears among the call's arguments."""
    found: list[str] = []
    empty = cst.Module([])

    class _Finder(cst.CSTVisitor):
        def _check(self, expr: cst.BaseExpression) -> bool:
            code = empty.code_for_node(expr)
            if code in codes and code not in found:
                found.append(code)
                return False
            return True

        def visit_Attribute(self, expr: cst.Attribute) -> bool:
            return self._check(expr)

        def visit_Name(self, expr: cst.Name) -> bool:
            return self._check(expr)

        def visit_Subscript(self, expr: cst.Subscript) -> bool:
            return self._check(expr)

    for arg in node.args:
        arg.value.visit(_Finder())
    return found[0] if found else None


def _in_loop(ctx: FileContext, stmt: cst.BaseStatement) -> bool:
    parent = ctx.facts.parent_statement(stmt)
    while parent is not None:
        if isinstance(parent, (cst.For, cst.While)):
            return True
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)):
            return False
        parent = ctx.facts.parent_statement(parent)
    return False


def _after_communicator(ctx: FileContext, stmt: cst.BaseStatement) -> bool:
    """Whether ``stmt`` runs after the communicator exists (it is created after ``anchor``, at
    the top of ``top_of``, or already exists at ``creation``)."""
    entry = ctx.entry
    if entry is None:
        return False
    mark = entry.creation if entry.exists else entry.anchor
    if mark is None:
        return entry.exists is False  # created at the top of the function or module
    return ctx.line(stmt) > ctx.line(mark)


def _indent_of(ctx: FileContext, stmt: cst.BaseStatement) -> int:
    depth = 0
    parent = ctx.facts.parent_statement(stmt)
    while parent is not None:
        depth += 1
        parent = ctx.facts.parent_statement(parent)
    return 4 * depth


def _append_positional(extra: str, break_line: bool) -> NodeFn:
    """A replace-fn adding ``extra`` after a call's last positional argument."""

    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        args = list(node.args)
        at = 0
        for i, arg in enumerate(args):
            if arg.keyword is None and not arg.star:
                at = i + 1
        new = cst.Arg(expression(extra))
        if at < len(args):
            new = new.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        if at > 0:
            prev = args[at - 1]
            after: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace(" ")
            if break_line:
                column = len(cst.Module([]).code_for_node(node.func)) + 1
                after = cst.ParenthesizedWhitespace(
                    first_line=cst.TrailingWhitespace(),
                    indent=True,
                    last_line=cst.SimpleWhitespace(" " * column),
                )
            if isinstance(prev.comma, cst.Comma):
                comma = prev.comma.with_changes(whitespace_after=after)
            else:
                comma = cst.Comma(whitespace_after=after)
            args[at - 1] = prev.with_changes(comma=comma)
            if at == len(args) and isinstance(prev.comma, cst.Comma):
                new = new.with_changes(comma=cst.Comma())  # keep the trailing comma last
        args.insert(at, new)
        return node.with_changes(args=args)

    return fn


# ----------------------------------------------------------------------- iteration schedules
def _extended(ctx: FileContext, call: cst.Call) -> CallFact | None:
    """For ``trainer.extend(X(...), trigger=...)``, the fact of ``X(...)``."""
    fact = ctx.facts.call_of(call)
    if fact is None or fact.method != "extend" or not call.args:
        return None
    return ctx.facts.call_of(call.args[0].value)


def _iteration_schedules(ctx: FileContext) -> None:
    """Weak scaling: what counts iterations now counts N times the examples per step."""
    units = ctx.facts.iteration_units if "iteration" in ctx.source or "Shift" in ctx.source else []
    seen: set[int] = set()
    per_step = "each iteration now takes comm.size times the examples (weak scaling)"
    for use in units:
        where: cst.CSTNode = use.call if use.call is not None else use.stmt
        line = ctx.line(where)
        if line in seen or ctx.suppressed(where, _STEP):
            continue
        seen.add(line)
        fact = ctx.facts.call_of(use.call)
        inner = _extended(ctx, use.call) if use.call is not None else None
        if fact is not None and vocab.is_trainer(fact.qname):
            message = (
                f"the Trainer stops after a number of iterations: {per_step}, so the run "
                "trains on comm.size times the examples of the original; divide the count by "
                "comm.size or give the stop trigger in epochs to keep the amount of training"
            )
        elif inner is not None and vocab.is_lr_shift(inner.qname):
            message = (
                f"{vocab.last(inner.qname)} triggered by iteration: {per_step}, so the "
                "schedule happens after comm.size times the examples (later in epochs); divide "
                "its iteration counts by comm.size, or trigger it by epoch"
            )
        else:
            message = (
                f"interval counted in iterations: {per_step}, so it fires every "
                "comm.size times as many examples (comm.size times less often per epoch)"
            )
        ctx.note(where, _STEP, "info", message, facts=(("iteration_schedule", "iteration"),))
    for call in ctx.facts.calls:
        if not vocab.is_extension(call.qname, *vocab.ITERATION_COUNTING_SHIFTS):
            continue
        line = ctx.line(call.node)
        parent = call.parent_call
        by_epoch = parent is not None and "'epoch'" in ctx.code(parent).replace('"', "'")
        if line in seen or by_epoch or ctx.suppressed(call.node, _STEP):
            continue
        seen.add(line)
        ctx.note(
            call.node,
            _STEP,
            "info",
            f"{vocab.last(call.qname)} counts its steps in iterations: {per_step}, so the "
            "schedule spans comm.size times the examples (later in epochs); divide its "
            "iteration counts by comm.size to keep it in examples",
            facts=(("iteration_schedule", vocab.last(call.qname)),),
        )


# ----------------------------------------------------------------------- learning rate
def _learning_rate(ctx: FileContext) -> None:
    optimizers = [c for c in ctx.facts.calls if ctx.builds_optimizer(c)]
    if not optimizers:
        return
    options = ctx.options
    first = optimizers[0].node
    if options.scale_lr == "none":
        if options.scaling == "weak" and _batch_sites(ctx):
            ctx.note(
                first,
                _STEP,
                "info",
                "learning rate as written while the global batch grows comm.size times; "
                "--scale-lr linear applies the linear scaling rule (lr times comm.size after "
                "a linear warm-up)",
            )
        return
    if options.scaling == "strong":
        ctx.note(
            first,
            _STEP,
            "info",
            "--scale-lr linear ignored: strong scaling keeps the global batch, so the learning "
            "rate stays as written",
        )
        return
    for opt in optimizers:
        if vocab.lr_hyperparameter(opt.qname) is None:
            ctx.note(
                opt.node,
                _STEP,
                "info",
                f"{vocab.last(opt.qname)} has no learning rate: left unscaled by --scale-lr",
            )
    trainers = [c for c in ctx.facts.calls if vocab.is_trainer(c.qname)]
    if not trainers:
        ctx.note(
            first,
            _STEP,
            "needs-person",
            "--scale-lr linear: no Trainer here, so no extension can warm the learning rate up; "
            f"in the loop, before each update, set optimizer.{_lr_names(optimizers)} = base * "
            f"(1 + (comm.size - 1) * min(1.0, train_iter.epoch_detail / "
            f"{options.warmup_epochs})) with base the rate as written",
        )
        return
    for trainer in trainers:
        _warm_up(ctx, trainer, optimizers)


def _batch_sites(ctx: FileContext) -> bool:
    return any(is_training_iterator(c.node) for c in iterator_calls(ctx))


def _lr_names(optimizers: list[CallFact]) -> str:
    names = sorted({vocab.lr_hyperparameter(o.qname) or "lr" for o in optimizers})
    return "/".join(names)


def _scaled_shift(ctx: FileContext, call: CallFact) -> bool:
    """A ``LinearShift`` whose values mention ``.size``: the warm-up written before."""
    return vocab.is_extension(call.qname, "LinearShift") and ".size" in ctx.code(call.node)


def _assigned_to(ctx: FileContext, call: CallFact) -> str | None:
    """``name`` when ``name = <call>`` (possibly wrapped in another call) is a whole statement."""
    node: cst.CSTNode = call.node
    for a in ctx.facts.assigns:
        if a.stmt is call.stmt and len(a.targets) == 1 and a.value is not None:
            value = a.value
            while isinstance(value, cst.Call) and value is not node:
                inner = [x.value for x in value.args if x.value is node or _holds(x.value, node)]
                if not inner:
                    break
                value = inner[0]
            if value is node and isinstance(_target(a.node), cst.Name):
                return a.targets[0]
    return None


def _target(node: cst.CSTNode) -> cst.BaseExpression | None:
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        return node.targets[0].target
    if isinstance(node, cst.AnnAssign):
        return node.target
    return None


def _holds(expr: cst.CSTNode, node: cst.CSTNode) -> bool:
    return isinstance(expr, cst.Call) and any(
        a.value is node or _holds(a.value, node) for a in expr.args
    )


def _warm_up(ctx: FileContext, trainer: CallFact, optimizers: list[CallFact]) -> None:
    epochs = ctx.options.warmup_epochs
    if any(_is_warmup(ctx, c) for c in ctx.facts.calls):
        return  # converted before
    name = _assigned_to(ctx, trainer)
    stmt = trainer.stmt
    if name is None or stmt is None or not ctx.visible(trainer.func):
        ctx.note(
            trainer.node,
            _STEP,
            "needs-person",
            "--scale-lr linear: the Trainer is not assigned to a name where the communicator "
            f"is visible; add the warm-up to it by hand (lr times comm.size over {epochs} "
            "epochs)",
        )
        return
    if ctx.suppressed(trainer.node, _STEP):
        return
    comm = ctx.comm_at(trainer.func, "learning rate")
    if comm is None:
        return
    span = f"{epochs} epoch{'s' if epochs != 1 else ''}"
    rule = f"# --scale-lr linear: learning rate x {comm}.size, reached over {span}\n"
    if ctx.options.target == "mnify":
        warmup = ctx.runtime.top("LinearWarmup")
        ctx.plan.insert_after(
            stmt,
            [statement(f"{rule}{name}.extend({warmup}({comm}.size, warmup_epochs={epochs}))\n")],
        )
        which = ", ".join(
            f"{vocab.last(o.qname)}: {vocab.lr_hyperparameter(o.qname)}"
            for o in optimizers
            if vocab.lr_hyperparameter(o.qname) is not None
        )
        ctx.note(
            trainer.node,
            _STEP,
            "changed",
            f"learning rate ({which}) times {comm}.size, reached by a linear warm-up over "
            f"{epochs} epochs ({warmup}); the script's own lr schedule is scaled with it",
        )
        return
    _linear_shifts(ctx, trainer, name, comm, optimizers, rule)


def _is_warmup(ctx: FileContext, call: CallFact) -> bool:
    return vocab.is_runtime_name(call.qname, "LinearWarmup") or _scaled_shift(ctx, call)


def _extensions_module(ctx: FileContext) -> str:
    """How this file spells Chainer's extensions module (importing chainer when it must)."""
    for local, module in ctx.facts.imported_modules.items():
        if module == vocab.EXTENSIONS_MODULE:
            return local
    chainer = ctx.facts.local_name_of("chainer")
    if chainer is None:
        ctx.imports_needed.add("import chainer")
        chainer = "chainer"
    return f"{chainer}.training.extensions"


def _linear_shifts(
    ctx: FileContext,
    trainer: CallFact,
    name: str,
    comm: str,
    optimizers: list[CallFact],
    rule: str,
) -> None:
    """``--target chainermn``: one ``LinearShift`` (Chainer's own) per optimizer."""
    epochs = ctx.options.warmup_epochs
    stmt = trainer.stmt
    assert stmt is not None
    before = ctx.line(stmt)
    iterators = {
        n
        for c in iterator_calls(ctx)
        if is_training_iterator(c.node)
        and c.func is trainer.func
        and (n := _assigned_to(ctx, c)) is not None
        and ctx.line(c.node) < before
    }
    if len(iterators) != 1:
        ctx.note(
            trainer.node,
            _STEP,
            "needs-person",
            "--scale-lr linear: the training iterator is not one name assigned before the "
            f"Trainer; add LinearShift warm-ups over {epochs} epochs by hand",
        )
        return
    it = iterators.pop()
    if epochs > 0:
        span = f"(0, {epochs} * len({it}.dataset) // {it}.batch_size)"
    else:
        span = "(0, 0)"
    shifts = [c for c in ctx.facts.calls if vocab.is_lr_shift(c.qname)]
    module = _extensions_module(ctx)
    made = []
    for opt in optimizers:
        attr = vocab.lr_hyperparameter(opt.qname)
        if attr is None:
            continue
        var = _assigned_to(ctx, opt)
        label = vocab.last(opt.qname)
        if var is None or opt.func is not trainer.func or ctx.line(opt.node) > before:
            ctx.note(
                opt.node,
                _STEP,
                "needs-person",
                f"--scale-lr linear: {label} is not assigned to a name before the Trainer; add "
                f"LinearShift('{attr}', (v, v * {comm}.size), ...) for it by hand",
            )
            continue
        clash = next((s for s in shifts if _shifts_attr(s, attr)), None)
        if clash is not None:
            ctx.note(
                clash.node,
                _STEP,
                "needs-person",
                f"--scale-lr linear: {vocab.last(clash.qname)} also sets '{attr}'; ChainerMN has "
                "no warm-up that composes with it (LinearShift would override it): start its "
                f"schedule from the rate times {comm}.size and warm up by hand",
            )
            continue
        start = f"{var}.{attr}"
        low = start if epochs > 0 else f"{start} * {comm}.size"
        q = ctx.q(attr)
        made.append(
            statement(
                f"{rule}{name}.extend({module}.LinearShift(\n"
                f"    {q}, ({low}, {start} * {comm}.size),\n"
                f"    {span},\n"
                f"    optimizer={var}))\n"
            )
        )
        ctx.note(
            opt.node,
            _STEP,
            "changed",
            f"{label}'s {attr} times {comm}.size, reached linearly over {epochs} epochs "
            "(Chainer's LinearShift: ChainerMN 7.8.1 has no warm-up of its own)",
        )
    if made:
        ctx.plan.insert_after(stmt, made)


def _shifts_attr(call: CallFact, attr: str) -> bool:
    args = call.node.args
    for arg in args:
        if arg.keyword is not None and arg.keyword.value == "attr":
            return isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == attr
    first = args[0].value if args and args[0].keyword is None else None
    return not isinstance(first, cst.SimpleString) or first.evaluated_value == attr


# ----------------------------------------------------------------------- count-normalised losses
_COUNT_METHODS = frozenset({"sum", "count_nonzero"})
_COUNT_HINT = re.compile(r"\.sum\(|count_nonzero")
_PASS_THROUGH = frozenset({"astype", "maximum", "max", "item", "clip", "reshape"})
_PASS_THROUGH_BUILTINS = frozenset({"builtins.max", "builtins.float", "builtins.int"})


def _count_normalised_losses(ctx: FileContext) -> None:
    if "/" not in ctx.source or not _COUNT_HINT.search(ctx.source):
        return  # no division, or nothing that counts: skip the walk
    for div in ctx.facts.divisions:
        func, right = div.func, div.right
        if not _is_sum_loss(ctx, div.left, func) or not _is_count(ctx, right, func, 0):
            continue
        if func is not None and "allreduce" in ctx.code(func):
            continue  # the count is made global already
        where = div.stmt
        if ctx.suppressed(where, _STEP):
            continue
        count = ctx.code(right)
        name = count if isinstance(right, cst.Name) else "n"
        fix = f"{name} = comm.allreduce_obj(float({count})) / comm.size"
        ctx.note(
            where,
            _STEP,
            "needs-person",
            f"loss divided by {count}, a count taken from this rank's batch (as in "
            "hard-negative mining): each rank divides by its own count, so the gradient "
            "averaged over ranks is not the single-process one; make the count global before "
            f"dividing: `{fix}` (pass the communicator to this code)",
        )


def _is_sum_loss(ctx: FileContext, expr: cst.BaseExpression, func: object) -> bool:
    """``F.sum(...)``, or a name this function assigned from ``F.sum(...)``."""
    fact = ctx.facts.call_of(expr)
    if fact is not None:
        return vocab.is_functions_sum(fact.qname)
    if isinstance(expr, cst.Name):
        return any(
            a.func is func and _is_sum_loss(ctx, a.value, func)
            for a in ctx.facts.assigns_of(expr.value)
            if a.value is not None and a.value is not expr
        )
    return False


def _is_count(ctx: FileContext, expr: cst.BaseExpression, func: object, depth: int) -> bool:
    """A number counted from the batch's contents: ``mask.sum()``, ``xp.count_nonzero(m)``,
    through ``max(n, 1)``, ``float(n)``, ``n.astype(...)``, ``n + eps`` and local names."""
    if depth > 4:
        return False
    if isinstance(expr, cst.Name):
        assigned = [a for a in ctx.facts.assigns_of(expr.value) if a.func is func]
        return bool(assigned) and all(
            a.value is not None and _is_count(ctx, a.value, func, depth + 1) for a in assigned
        )
    if isinstance(expr, cst.BinaryOperation) and isinstance(
        expr.operator, (cst.Add, cst.Subtract, cst.Multiply)
    ):
        return _is_count(ctx, expr.left, func, depth + 1) or _is_count(
            ctx, expr.right, func, depth + 1
        )
    if isinstance(expr, cst.Attribute) and expr.attr.value in ("array", "data"):
        return _is_count(ctx, expr.value, func, depth + 1)
    fact = ctx.facts.call_of(expr)
    if fact is None:
        return False
    method = fact.method
    if method is not None and "allreduce" in method:
        return False
    last = vocab.last(fact.qname) if fact.qname else (method or "")
    if fact.qname == "builtins.sum":
        return False
    if method in _COUNT_METHODS or last == "count_nonzero":
        return True
    if fact.qname in _PASS_THROUGH_BUILTINS or method in _PASS_THROUGH:
        inner: list[cst.BaseExpression] = [a.value for a in fact.node.args]
        if isinstance(fact.node.func, cst.Attribute) and method in _PASS_THROUGH:
            inner.append(fact.node.func.value)
        return any(_is_count(ctx, x, func, depth + 1) for x in inner)
    return False
