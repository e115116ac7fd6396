"""``mnify convert --grow-batch``: grow the global batch where the script decays the learning rate.

With SGD, dividing the learning rate by ``f`` and multiplying the batch by ``f`` follow the same
noise scale (Smith et al., ICLR 2018), and the second takes ``f`` times fewer updates, so ``f``
times fewer gradient all-reduces, for the same epochs. Implied ``--data global`` and
``--scaling strong`` make the script's batch the global batch of ``mn.create_global_batch_iterator``
(step ``global-data``); this step replaces, inside ``trainer.extend(...)``:

- ``extensions.ExponentialShift('lr' | 'alpha', rate)`` with ``1 / rate`` an integer ``f >= 2``
  -> ``mn.extensions.GrowBatch(f)``, the trigger kept;
- ``extensions.StepShift(attr, gamma, step)`` called once an epoch -> ``GrowBatch(f)`` triggered
  every ``step`` epochs;
- ``extensions.MultistepShift(attr, gamma, steps, init)`` -> ``GrowBatch(f)`` triggered by
  ``ManualScheduleTrigger(steps, unit)``: epochs as written; iterations (its default) recounted
  for the grown batch, so each growth comes after as many examples as the decay did (integer
  literals only);
- a ``@training.make_extension`` function of the script whose body is only
  ``<optimizer>.lr *= r`` (or ``alpha``; ``/= f``) -> ``GrowBatch(f, trigger=...)`` where it is
  registered (the function stays, unused).

Only schedules counted in epochs (or the recounted iteration points) are replaced: an interval
of ``n`` iterations covers ``f`` times the examples once the batch grew, so it is left, with the
reason, as is everything else (a rate whose inverse is not an integer, ``init``/``target``/
``optimizer`` arguments, a trigger the converter cannot read). ``max_per_rank`` is the script's
batch where Chainer's ``StandardUpdater`` trains: a rank never computes more examples at once
than the original run did on its one device; a larger share accumulates micro-batches before
one all-reduce. The report lists each replacement, the global batch of each phase and the
updates per epoch of each phase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites import global_data
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.iterators import iterator_calls
from mnify.rewrites.registry import rewrite

_STEP = "grow-batch"
_SHIFTS = ("ExponentialShift", "StepShift", "MultistepShift")
_SIGNATURES: dict[str, tuple[str, ...]] = {
    "ExponentialShift": ("attr", "rate", "init", "target", "optimizer"),
    "StepShift": ("attr", "gamma", "step", "init", "target", "optimizer"),
    "MultistepShift": ("attr", "gamma", "step_value", "init", "optimizer"),
}
_EXTEND = ("extension", "name", "trigger", "priority")
_LR_NAMES = ("lr", "alpha")


@dataclass(frozen=True)
class _Schedule:
    """What replaces one decay: the factor, the trigger's code (None: keep the extend's), and
    the phases for the report."""

    factor: int
    trigger: str | None
    phases: str


def _number(node: cst.BaseExpression) -> Fraction | None:
    """An int or float literal (``0.1``, ``1e-1``, ``1 / 10``) as an exact fraction."""
    if isinstance(node, cst.Integer):
        return Fraction(int(node.evaluated_value))
    if isinstance(node, cst.Float):
        return Fraction(str(node.evaluated_value)).limit_denominator(10**6)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        left, right = _number(node.left), _number(node.right)
        if left is not None and right:
            return left / right
    return None


def _factor(rate: Fraction | None) -> int | None:
    """``1 / rate`` when it is an integer of at least 2 (a decay by 0.1, 0.5, 0.25...)."""
    if rate is None or rate <= 0 or rate >= 1:
        return None
    inverse = 1 / rate
    return int(inverse) if inverse.denominator == 1 and inverse >= 2 else None


def _unit(node: cst.BaseExpression | None) -> tuple[int, str] | None:
    """``(n, 'epoch')`` or ``(n, 'iteration')`` with a literal ``n``."""
    if not isinstance(node, cst.Tuple) or len(node.elements) != 2:
        return None
    count, unit = (e.value for e in node.elements)
    if not isinstance(count, cst.Integer) or not isinstance(unit, cst.SimpleString):
        return None
    text = unit.evaluated_value
    if text not in ("epoch", "iteration"):
        return None
    return int(count.evaluated_value), str(text)


def _points(node: cst.BaseExpression) -> list[int] | None:
    if not isinstance(node, (cst.List, cst.Tuple)):
        return None
    found = []
    for element in node.elements:
        if not isinstance(element.value, cst.Integer):
            return None
        found.append(int(element.value.evaluated_value))
    return found if found == sorted(found) and found else None


def _recount(points: list[int], factor: int) -> list[int] | None:
    """Iteration milestones of a decay at batch B, recounted for a batch that grows by
    ``factor`` at each: the same examples seen at each growth. None if one is not whole."""
    out: list[int] = []
    at, examples_step = Fraction(0), Fraction(1)  # iteration, batch in units of B
    previous = 0
    for point in points:
        at += Fraction(point - previous) / examples_step
        if at.denominator != 1:
            return None
        out.append(int(at))
        previous = point
        examples_step *= factor
    return out


class GrowBatchPlan:
    """The file's replacements, given the global batch the global-data step set up."""

    def __init__(self, ctx: FileContext, batch: str) -> None:
        self.ctx = ctx
        self.batch = batch

    def phases(self, factor: int, starts: list[str], every: str | None = None) -> str:
        """``global batch B, then B*f from epoch 30 ...; updates per epoch len(train)/B ...``"""
        batch = self.batch if re.fullmatch(r"[\w.]+", self.batch) else f"({self.batch})"
        if every is not None:
            return (
                f"global batch {self.batch}, times {factor} {every} (phase k: {batch} * "
                f"{factor}**k); updates per epoch: N / ({batch} * {factor}**k) for N training "
                "examples"
            )
        sizes = [self.batch] + [f"{batch} * {factor ** (k + 1)}" for k in range(len(starts))]
        parts = [f"{sizes[0]} from the start"] + [
            f"{size} from {start}" for size, start in zip(sizes[1:], starts, strict=True)
        ]
        updates = ", ".join(f"N / ({size})" for size in sizes)
        return (
            f"global batch per phase: {'; '.join(parts)}; updates per epoch per phase: "
            f"{updates} for N training examples"
        )

    def shift(self, call: CallFact, extend: CallFact) -> _Schedule | str:
        """The schedule replacing a Chainer shift, or why it stays."""
        name = vocab.last(call.qname)
        bound = global_data.bound_arguments(call.node, _SIGNATURES[name])
        if bound is None:
            return "its arguments cannot be read (*args or **kwargs)"
        attr = bound.get("attr")
        if attr is None or not isinstance(attr.value, cst.SimpleString):
            return "the hyperparameter it shifts is not a literal 'lr' or 'alpha'"
        if attr.value.evaluated_value not in _LR_NAMES:
            return f"it shifts {attr.value.evaluated_value!r}, not the learning rate"
        extra = sorted(set(bound) & {"target", "optimizer"})
        if name != "MultistepShift" and "init" in bound:
            extra.insert(0, "init")
        if extra:
            return f"it sets {', '.join(extra)}, which GrowBatch has no counterpart for"
        rate_arg = bound.get("rate" if name == "ExponentialShift" else "gamma")
        factor = _factor(_number(rate_arg.value)) if rate_arg is not None else None
        if factor is None:
            code = self.ctx.code(rate_arg.value) if rate_arg is not None else "?"
            return f"its rate {code} is not 1/f for an integer f >= 2"
        trigger_arg = global_data.bound_arguments(extend.node, _EXTEND)
        trigger = (trigger_arg or {}).get("trigger")
        if name == "ExponentialShift":
            return self._exponential(factor, trigger)
        unit = _unit(trigger.value) if trigger is not None else (1, "iteration")
        if unit is None or unit[0] != 1:
            return "it is called on a trigger other than every epoch or every iteration"
        if name == "StepShift":
            step = bound.get("step")
            if step is None or not isinstance(step.value, cst.Integer):
                return "its step is not an integer literal"
            if unit[1] != "epoch":
                return (
                    "it counts iterations: after the batch grows, an interval of iterations "
                    "covers more examples; call it once an epoch (trigger=(1, 'epoch'))"
                )
            n = int(step.value.evaluated_value)
            return _Schedule(
                factor, f"({n}, 'epoch')", self.phases(factor, [], f"every {n} epochs")
            )
        steps = bound.get("step_value")
        points = _points(steps.value) if steps is not None else None
        if points is None:
            return "its steps are not a literal list of integers"
        if unit[1] == "iteration":
            recounted = _recount(points, factor)
            if recounted is None:
                return (
                    "its iteration steps do not recount to whole iterations of the grown "
                    "batch; give them in epochs (trigger=(1, 'epoch'))"
                )
            points = recounted
        listed = ", ".join(str(p) for p in points)
        trigger_code = f"{_manual_trigger_name(self.ctx)}([{listed}], '{unit[1]}')"
        starts = [f"{unit[1]} {p}" for p in points]
        return _Schedule(factor, trigger_code, self.phases(factor, starts))

    def _exponential(self, factor: int, trigger: cst.Arg | None) -> _Schedule | str:
        if trigger is None:
            return (
                "it runs every iteration (no trigger): a decay per iteration is not a batch "
                "schedule"
            )
        unit = _unit(trigger.value)
        if unit is not None:
            if unit[1] != "epoch":
                return (
                    "its trigger counts iterations: after the batch grows, an interval of "
                    "iterations covers more examples; trigger it in epochs"
                )
            return _Schedule(factor, None, self.phases(factor, [], f"every {unit[0]} epochs"))
        fact = self.ctx.facts.call_of(trigger.value)
        if fact is not None and vocab.last(fact.qname) == "ManualScheduleTrigger":
            points_arg = global_data.bound_arguments(fact.node, ("points", "unit"))
            unit_arg = (points_arg or {}).get("unit")
            if (
                unit_arg is not None
                and isinstance(unit_arg.value, cst.SimpleString)
                and unit_arg.value.evaluated_value == "epoch"
            ):
                points = _points(points_arg["points"].value) if points_arg else None
                starts = [f"epoch {p}" for p in points] if points else []
                every = None if points else "at the trigger's epochs"
                return _Schedule(factor, None, self.phases(factor, starts, every))
        return "its trigger is not one the converter can read as counted in epochs"


def _global_batch(ctx: FileContext) -> str | None:
    """The global batch of the file's global-batch iterator (the script's batch, strong)."""
    for call in iterator_calls(ctx):
        if global_data.replaces(ctx, call):
            bound = global_data.bound_arguments(
                call.node, global_data.iterator_parameters(call.qname)
            )
            if bound is not None and "batch_size" in bound:
                return ctx.code(bound["batch_size"].value)
    return None


def _standard_updater(ctx: FileContext) -> bool:
    """The script trains with Chainer's StandardUpdater (GrowBatch's accumulation replaces its
    step; a custom updater's step is its own)."""
    return any(vocab.is_standard_updater(c.qname) for c in ctx.facts.calls) and not any(
        vocab.last(c.qname) in vocab.MULTI_GPU_UPDATERS for c in ctx.facts.calls
    )


@rewrite(_STEP, order=37, code="MN819")
def plan(ctx: FileContext) -> None:
    if not ctx.options.grow_batch or not ctx.options.global_data:
        return
    decays = _decays(ctx)
    if not decays:
        return
    batch = _global_batch(ctx)
    if batch is None:
        for node, _ in decays:
            ctx.note(
                node,
                _STEP,
                "needs-person",
                "--grow-batch: no training iterator here became the global-batch iterator, "
                "whose batch GrowBatch grows: this learning-rate decay stays",
            )
        return
    grow = GrowBatchPlan(ctx, batch)
    cap = f", max_per_rank={batch}" if _standard_updater(ctx) else ""
    name = ctx.runtime.top("extensions.GrowBatch")
    for node, kind in decays:
        if isinstance(kind, CallFact):
            _replace_shift(ctx, grow, node, kind, name, cap)
        else:
            _replace_function(ctx, grow, node, kind, name, cap)


def _decays(ctx: FileContext) -> list[tuple[cst.Call, CallFact | cst.FunctionDef]]:
    """Each decay registered with ``trainer.extend``: (the extend call, the shift's fact or the
    plain make_extension function)."""
    functions = _plain_decay_functions(ctx)
    found: list[tuple[cst.Call, CallFact | cst.FunctionDef]] = []
    for call in ctx.facts.calls:
        if call.method != "extend" or not call.node.args or call.stmt is None:
            continue
        if ctx.suppressed(call.node, _STEP):
            continue
        first = call.node.args[0].value
        inner = ctx.facts.call_of(first)
        if inner is not None and vocab.is_extension(inner.qname, *_SHIFTS):
            found.append((call.node, inner))
        elif isinstance(first, cst.Name) and first.value in functions:
            found.append((call.node, functions[first.value]))
    return found


def _replace_shift(
    ctx: FileContext, grow: GrowBatchPlan, extend: cst.Call, shift: CallFact, name: str, cap: str
) -> None:
    extend_fact = ctx.facts.call_of(extend)
    assert extend_fact is not None and extend_fact.stmt is not None
    what = ctx.code(shift.node)
    schedule = grow.shift(shift, extend_fact)
    if isinstance(schedule, str):
        ctx.note(shift.node, _STEP, "needs-person", f"--grow-batch: {what} stays: {schedule}")
        return
    value = f"{name}({schedule.factor}{cap})"
    ctx.plan.replace_node(shift.node, _expression(value), extend_fact.stmt)
    if schedule.trigger is not None:
        bound = global_data.bound_arguments(extend, _EXTEND) or {}
        trigger = bound.get("trigger")
        if trigger is not None:
            ctx.plan.replace_node(trigger, _arg(schedule.trigger), extend_fact.stmt)
        else:
            ctx.plan.replace_node(extend, _add_trigger(schedule.trigger), extend_fact.stmt)
    _report(ctx, shift.node, what, value, schedule)
    if vocab.last(shift.qname) == "MultistepShift":
        ctx.note(
            shift.node,
            _STEP,
            "info",
            "MultistepShift set the learning rate to its init from the start; GrowBatch keeps "
            "the optimizer's own: they agree when init is the optimizer's learning rate",
        )


def _replace_function(
    ctx: FileContext,
    grow: GrowBatchPlan,
    extend: cst.Call,
    func: cst.FunctionDef,
    name: str,
    cap: str,
) -> None:
    extend_fact = ctx.facts.call_of(extend)
    assert extend_fact is not None and extend_fact.stmt is not None
    factor = _plain_factor(func)
    assert factor is not None
    bound = global_data.bound_arguments(extend, _EXTEND) or {}
    trigger = bound.get("trigger")
    decorated = _decorator_trigger(ctx, func)
    code = trigger.value if trigger is not None else decorated
    unit = _unit(code) if code is not None else None
    what = f"{func.name.value} (lr *= 1/{factor})"
    if unit is None or unit[1] != "epoch":
        ctx.note(
            extend,
            _STEP,
            "needs-person",
            f"--grow-batch: {what} stays: its trigger is not an interval in epochs",
        )
        return
    own = "" if trigger is not None else f", trigger={ctx.code(code)}" if code else ""
    value = f"{name}({factor}{cap}{own})"
    ctx.plan.replace_node(extend.args[0].value, _expression(value), extend_fact.stmt)
    schedule = _Schedule(factor, None, grow.phases(factor, [], f"every {unit[0]} epochs"))
    _report(ctx, extend, what, value, schedule)


def _report(
    ctx: FileContext, node: cst.CSTNode, what: str, value: str, schedule: _Schedule
) -> None:
    trigger = f" on {schedule.trigger}" if schedule.trigger else " on the same trigger"
    ctx.note(
        node,
        _STEP,
        "changed",
        f"--grow-batch: {what} -> {value}{trigger}: the global batch grows {schedule.factor}x "
        f"where the learning rate was divided by {schedule.factor}; {schedule.phases}",
        facts=(("grow_factor", str(schedule.factor)),),
    )


# --------------------------------------------------------------------- plain make_extension
def _plain_decay_functions(ctx: FileContext) -> dict[str, cst.FunctionDef]:
    """``@training.make_extension(...)`` functions whose only statement is ``X.lr *= r``."""
    found: dict[str, cst.FunctionDef] = {}

    class _Functions(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            if _is_make_extension(ctx, node) and _plain_factor(node) is not None:
                found[node.name.value] = node

    ctx.module.visit(_Functions())
    return found


def _is_make_extension(ctx: FileContext, func: cst.FunctionDef) -> bool:
    for decorator in func.decorators:
        target = decorator.decorator
        target = target.func if isinstance(target, cst.Call) else target
        if ctx.code(target).rsplit(".", 1)[-1] == "make_extension":
            return True
    return False


def _decorator_trigger(ctx: FileContext, func: cst.FunctionDef) -> cst.BaseExpression | None:
    for decorator in func.decorators:
        call = decorator.decorator
        if isinstance(call, cst.Call):
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value == "trigger":
                    return arg.value
    return None


def _plain_factor(func: cst.FunctionDef) -> int | None:
    """``f`` for a body that is only ``X.lr *= 1/f`` or ``X.lr /= f`` (a docstring allowed)."""
    body = func.body.body if isinstance(func.body, cst.IndentedBlock) else ()
    statements = [
        s
        for s in body
        if not (
            isinstance(s, cst.SimpleStatementLine)
            and len(s.body) == 1
            and isinstance(s.body[0], cst.Expr)
            and isinstance(s.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        )
    ]
    if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
        return None
    line = statements[0]
    if len(line.body) != 1 or not isinstance(line.body[0], cst.AugAssign):
        return None
    aug = line.body[0]
    if not isinstance(aug.target, cst.Attribute) or aug.target.attr.value not in _LR_NAMES:
        return None
    value = _number(aug.value)
    if isinstance(aug.operator, cst.MultiplyAssign):
        return _factor(value)
    if isinstance(aug.operator, cst.DivideAssign) and value is not None:
        return _factor(1 / value) if value > 1 else None
    return None


# ---------------------------------------------------------------------------------- edits
def _manual_trigger_name(ctx: FileContext) -> str:
    """How this file can name ``chainer.training.triggers.ManualScheduleTrigger``."""
    chainer = ctx.facts.local_name_of("chainer")
    if chainer is None:
        ctx.imports_needed.add("import chainer")
        chainer = "chainer"
    return f"{chainer}.training.triggers.ManualScheduleTrigger"


def _expression(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.BaseExpression)
        return expression(value).with_changes(lpar=node.lpar, rpar=node.rpar)

    return fn


def _arg(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Arg)
        return node.with_changes(value=expression(value))

    return fn


def _add_trigger(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        args = list(node.args)
        last = args[-1]
        if not isinstance(last.comma, cst.Comma):
            args[-1] = last.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        args.append(
            cst.Arg(
                expression(value),
                keyword=cst.Name("trigger"),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(""),
                ),
            )
        )
        return node.with_changes(args=args)

    return fn
