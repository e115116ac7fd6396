"""docs/design.md §1, step "evaluator": every rank evaluates its shard; the ranks' results are
combined into the result over the whole test set.

Two kinds of evaluator, told apart here:

* **Means over examples** (``extensions.Evaluator`` and subclasses of this file that do not
  override ``evaluate``): ``mn.create_multi_node_evaluator(extensions.Evaluator(...), comm)``,
  which combines the ranks' means weighted by examples.
* **Metrics over the whole test set** (a subclass of this file that overrides ``evaluate``,
  directly or through another class of this file, or a library evaluator whose metric is not a
  mean: ``vocab.WHOLE_SET_EVALUATORS``, chainercv's mAP/mIoU, chainer-chemistry's ROC-AUC):
  averaging per-shard values would be wrong. Under ``--target mnify`` they become
  ``mn.create_multi_node_evaluator(MapEvaluator(...), comm, gather=True)``: every rank runs the
  evaluator's own ``evaluate()`` on its shard, what it read and what the model answered go to
  rank 0, which runs ``evaluate()`` over all of it (the model's answers replayed, not
  recomputed) and hands the result to every rank. Nothing in the user's ``evaluate()`` needs to
  change, which is why this is generic. Their test iterators are listed by
  :func:`gathered_test_iterators`: scattered without repeated examples
  (``force_equal_length=False``; the gathering evaluator has no per-batch collective).
  ChainerMN 7.8.1 has no such wrapper (its ``GenericMultiNodeEvaluator`` needs the user to
  write ``calc_local``/``aggregate``), so under ``--target chainermn`` the evaluator stays as it
  is and every rank evaluates the whole, unscattered test set (:func:`full_test_iterators`):
  the same value on every rank, as long as rank 0 alone would take, and no rank left waiting
  in a collective.

A script without a Trainer evaluates in loops of its own (``for batch in test_iter:`` summing
accuracies, inline or in a function of the file; early stopping on the result). Their
arithmetic is the user's, so nothing can combine per-rank values generically: when every
iterator over a dataset is ``repeat=False`` and every use of it is such a loop that updates
nothing (:func:`hand_evaluated_datasets`), rank 0 still loads the dataset and
``comm.bcast_obj`` hands it whole to every rank instead of scattering it. Every rank then
computes the one-process value (so ranks that stop early stop together); the evaluation is not
sped up. Any other use of an evaluation iterator (a library helper, ``next()``) keeps the
scatter and goes to a person.

Not under ``--model-parallel channel``: there every rank already sees the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import PositionProvider

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.iterators import (
    dataset_arg,
    dataset_name,
    is_training_iterator,
    iterator_calls,
)
from mnify.rewrites.registry import rewrite
from mnify.rewrites.wrapping import wrap_call


def _check_early_stopping(ctx: FileContext) -> None:
    """Ranks must stop together: the monitored value has to be the same on every rank."""
    for call in ctx.facts.calls:
        if not vocab.is_early_stopping(call.qname):
            continue
        monitor = next(
            (a.value for a in call.node.args if a.keyword and a.keyword.value == "monitor"), None
        )
        if isinstance(monitor, cst.SimpleString) and str(monitor.evaluated_value).startswith(
            "validation/"
        ):
            ctx.note(
                call.node,
                "evaluator",
                "info",
                "EarlyStoppingTrigger watches a validation key: the multi-node evaluator "
                "reports the same value on every rank, so every rank stops at the same epoch",
            )
            continue
        shown = ctx.code(monitor) if monitor is not None else "'main/loss' (the default)"
        ctx.note(
            call.node,
            "evaluator",
            "needs-person",
            f"EarlyStoppingTrigger monitors {shown}: every rank must see the same value or "
            "ranks stop at different epochs and the job hangs; monitor a 'validation/...' key",
        )


def _check_hand_written_evaluation(ctx: FileContext) -> None:
    """Without a Trainer there is no Evaluator to wrap. A loop that only evaluates gets the
    whole test set on every rank (:func:`hand_evaluated_datasets`); any other loop over a
    scattered test set measures this rank's shard only."""
    if any(vocab.is_trainer(c.qname) for c in ctx.facts.calls):
        return
    whole = hand_evaluated_datasets(ctx)
    for call in iterator_calls(ctx):
        if is_training_iterator(call.node):
            continue
        if call.stmt is not None and ctx.under_rank0_guard(call.stmt):
            continue  # after training, on rank 0, which keeps the whole dataset (dataset step)
        uses = _iterator_uses(ctx, call)
        if uses is not None and uses.trains():
            continue  # a repeat=False iterator a training loop reads: its data is scattered
        if dataset_name(call.node) in whole:
            ctx.note(
                call.node,
                "evaluator",
                "info",
                "evaluation in a hand-written loop: every rank evaluates the whole test set "
                "(rank 0 loads it, bcast_obj hands it to the others), so the value is the one "
                "process's value on every rank; this evaluation is not sped up",
            )
            continue
        ctx.note(
            call.node,
            "evaluator",
            "needs-person",
            "evaluation in a hand-written loop sees only this rank's shard of the test set: "
            "average the sums over ranks (comm.allreduce_obj) before printing them",
        )


# ------------------------------------------------------------------ hand-written evaluation
_TRAINING_METHODS = frozenset({"update", "backward", "cleargrads", "zerograds", "update_core"})
"""Calls that make a loop a training loop: a loop over an iterator that calls none of them
only reads the model."""


class _IteratorUses(cst.CSTVisitor):
    """How one function (or the module) uses an iterator variable: ``for x in it`` loops
    (``copy.copy(it)`` too), ``it.reset()`` and passing it to a function of this file that
    uses its parameter only so (``evaluate(model, it)``) are evaluation uses; anything else
    (``it.next()``, a library helper) is not understood."""

    def __init__(
        self,
        name: str,
        assigned: set[int],
        functions: dict[str, cst.FunctionDef],
        depth: int = 0,
    ) -> None:
        self.name = name
        self.assigned = assigned  # the Name nodes that bind it (a parameter's name too)
        self.functions = functions  # this file's module-level functions
        self.depth = depth
        self.loops = 0
        self.updates = False
        self.understood: set[int] = set()
        self.seen: list[cst.Name] = []

    def _is_it(self, node: cst.BaseExpression) -> cst.Name | None:
        if isinstance(node, cst.Name) and node.value == self.name:
            return node
        if isinstance(node, cst.Call) and len(node.args) == 1:  # copy.copy(it)
            inner = node.args[0].value
            if isinstance(inner, cst.Name) and inner.value == self.name:
                return inner
        return None

    def visit_For(self, node: cst.For) -> None:
        it = self._is_it(node.iter)
        if it is None:
            return
        self.loops += 1
        self.understood.add(id(it))
        body = _MethodCalls()
        node.body.visit(body)
        self.updates = self.updates or bool(body.methods & _TRAINING_METHODS)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "reset"
            and isinstance(func.value, cst.Name)
            and func.value.value == self.name
        ):
            self.understood.add(id(func.value))
        if isinstance(func, cst.Name) and func.value in self.functions and self.depth < 3:
            self._follow(node, self.functions[func.value])

    def _follow(self, call: cst.Call, helper: cst.FunctionDef) -> None:
        """``evaluate(model, it)``: the helper's parameter must be used as this is."""
        params = [*helper.params.posonly_params, *helper.params.params]
        for i, arg in enumerate(call.args):
            if not (isinstance(arg.value, cst.Name) and arg.value.value == self.name):
                continue
            if arg.star:
                return
            if arg.keyword is not None:
                param = next((p for p in params if p.name.value == arg.keyword.value), None)
            else:
                param = params[i] if i < len(params) else None
            if param is None:
                return
            inner = _IteratorUses(
                param.name.value, {id(param.name)}, self.functions, self.depth + 1
            )
            helper.visit(inner)
            if not inner.only_evaluates():
                return
            self.loops += inner.loops
            self.understood.add(id(arg.value))

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name:
            self.seen.append(node)

    def _understood(self) -> bool:
        return self.loops > 0 and all(
            id(n) in self.understood or id(n) in self.assigned for n in self.seen
        )

    def only_evaluates(self) -> bool:
        return self._understood() and not self.updates

    def trains(self) -> bool:
        """Every use is a loop over it and some loop updates: training by epochs."""
        return self._understood() and self.updates


class _MethodCalls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.methods: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Attribute):
            self.methods.add(node.func.attr.value)


def _iterator_uses(ctx: FileContext, call: CallFact) -> _IteratorUses | None:
    """How the variable this ``repeat=False`` iterator is bound to is used, when it is bound to
    one name and every binding of that name is such an iterator (else None)."""
    if is_training_iterator(call.node) or call.stmt is None:
        return None
    bound = [a for a in ctx.facts.assigns if a.value is call.node]
    if len(bound) != 1 or len(bound[0].targets) != 1:
        return None
    name = bound[0].targets[0]
    bindings = ctx.facts.assigns_of(name)
    if any(
        (made := ctx.facts.call_of(b.value)) is None
        or made.func is not call.func
        or is_training_iterator(made.node)
        for b in bindings
    ):
        return None
    scope: cst.CSTNode = call.func if call.func is not None else ctx.module
    names = _BindingNames(name)
    for b in bindings:
        b.node.visit(names)
    uses = _IteratorUses(name, names.found, ctx.facts.module_functions)
    scope.visit(uses)
    return uses


def _only_evaluates(ctx: FileContext, call: CallFact) -> bool:
    """Every use of this iterator is a loop that updates nothing."""
    uses = _iterator_uses(ctx, call)
    return uses is not None and uses.only_evaluates()


class _BindingNames(cst.CSTVisitor):
    """The ``Name`` nodes an assignment binds ``name`` with."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.found: set[int] = set()

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if isinstance(node.target, cst.Name) and node.target.value == self.name:
            self.found.add(id(node.target))


def hand_evaluated_datasets(ctx: FileContext) -> set[str]:
    """Datasets read only by hand-written evaluation loops (a script without a Trainer): every
    iterator over them is ``repeat=False`` and only evaluates (:func:`_only_evaluates`). Every
    rank evaluates them whole, so the loop's own arithmetic (a mean of batch accuracies, early
    stopping on it) gives one process's value on every rank; rank 0 loads them and hands them
    to the others (docs/converter.md, MN805)."""
    if not ctx.options.data_parallel or any(vocab.is_trainer(c.qname) for c in ctx.facts.calls):
        return set()
    verdict: dict[str, bool] = {}
    for call in iterator_calls(ctx):
        name = dataset_name(call.node)
        if name is None:
            continue
        verdict[name] = verdict.get(name, True) and _only_evaluates(ctx, call)
    return {name for name, whole in verdict.items() if whole}


# ---------------------------------------------------------------------------------- kinds
def _defines_evaluate(cls: cst.ClassDef) -> bool:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return any(
        isinstance(stmt, cst.FunctionDef) and stmt.name.value == vocab.EVALUATE_METHOD
        for stmt in body
    )


def evaluator_classes(ctx: FileContext) -> dict[str, bool]:
    """This file's Evaluator subclasses (through other classes of the file too), each with
    whether its metric is over the whole test set: it overrides ``evaluate`` (or a base of this
    file does), or it derives from a library evaluator whose metric is not a mean."""
    kinds: dict[str, bool] = dict(ctx.project_evaluators)  # other files' (module.Class)
    for name, bases in ctx.facts.class_bases.items():  # in order: bases come first
        parents = [b for b in bases if vocab.is_evaluator_class(b) or b.lstrip(".") in kinds]
        if parents:
            kinds[name] = (
                _defines_evaluate(ctx.facts.classes[name])
                or any(vocab.is_whole_set_evaluator(b) for b in parents)
                or any(kinds.get(b.lstrip("."), False) for b in parents)
            )
    return kinds


def project_evaluators(ctx: FileContext) -> dict[str, bool]:
    """This file's Evaluator subclasses under their qualified names (``evaluator.MAPEvaluator``),
    for the files that import them."""
    own = {k: v for k, v in evaluator_classes(ctx).items() if k in ctx.facts.class_bases}
    return {f"{ctx.module_name}.{name}": whole for name, whole in own.items()}


def _kind(call: CallFact, classes: dict[str, bool]) -> str | None:
    """``"mean"``, ``"whole-set"`` or None (not an evaluator construction)."""
    bare = call.qname.lstrip(".")
    for name, whole in classes.items():
        if bare == name or ("." in name and bare.endswith("." + name)):
            return "whole-set" if whole else "mean"
    if vocab.is_whole_set_evaluator(call.qname):
        return "whole-set"
    if vocab.is_evaluator(call.qname):
        return "mean"
    return None


@dataclass(eq=False)
class _WholeSet:
    """An evaluator construction whose metric is over the whole test set, and its iterators."""

    call: CallFact
    names: set[str] = field(default_factory=set)  # iterator variables it evaluates
    inline: list[cst.Call] = field(default_factory=list)  # iterators built in its arguments


def _iterator_arg(call: cst.Call) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "iterator":
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[0].value if positional else None


def _whole_set_sites(ctx: FileContext) -> list[_WholeSet]:
    classes = evaluator_classes(ctx)
    sites = []
    for call in ctx.facts.calls:
        if _kind(call, classes) != "whole-set":
            continue
        site = _WholeSet(call)
        value = _iterator_arg(call.node)
        values = (
            [e.value for e in value.elements if isinstance(e, cst.DictElement)]
            if isinstance(value, cst.Dict)
            else [value]
        )
        for v in values:
            if isinstance(v, cst.Name):
                site.names.add(v.value)
            elif isinstance(v, cst.Call):
                site.inline.append(v)
        sites.append(site)
    return sites


def _gathers(ctx: FileContext) -> bool:
    """Whole-set evaluators gather to rank 0 (mnify) or run on the whole set (ChainerMN)."""
    return ctx.options.target == "mnify"


def full_test_iterators(ctx: FileContext) -> set[str]:
    """Iterator variables whose dataset every rank must keep whole (not scattered): those of
    whole-set evaluators under ``--target chainermn``, which every rank runs on the whole test
    set (see the module docstring). Empty under ``--target mnify``."""
    if not ctx.options.data_parallel or _gathers(ctx):
        return set()
    return {name for site in _whole_set_sites(ctx) for name in site.names}


def gathered_test_iterators(ctx: FileContext) -> set[str]:
    """Iterator variables of evaluators wrapped with ``gather=True`` (``--target mnify``): their
    datasets are scattered with ``force_equal_length=False``, so no example counts twice in
    the metric computed over the gathered shards."""
    if not ctx.options.data_parallel or not _gathers(ctx):
        return set()
    return {name for site in _whole_set_sites(ctx) for name in site.names}


def _feeds_whole_set_evaluator(ctx: FileContext, iterator: CallFact) -> bool:
    """This iterator construction is assigned to a whole-set evaluator's iterator variable or
    built inline as such an evaluator's argument."""
    for site in _whole_set_sites(ctx):
        if any(inline is iterator.node for inline in site.inline):
            return True
        for fact in ctx.facts.assigns:
            if fact.value is iterator.node and set(fact.targets) & site.names:
                return True
    return False


def keeps_full_test_set(ctx: FileContext, iterator: CallFact) -> bool:
    """Whether this iterator construction must get the whole test set (not scattered): it
    feeds a whole-set evaluator under ``--target chainermn`` (see :func:`full_test_iterators`)."""
    if not ctx.options.data_parallel or _gathers(ctx):
        return False
    return _feeds_whole_set_evaluator(ctx, iterator)


def gathers_test_set(ctx: FileContext, iterator: CallFact) -> bool:
    """Whether this iterator construction feeds an evaluator wrapped with ``gather=True``
    (``--target mnify``): scatter its dataset with ``force_equal_length=False``."""
    if not ctx.options.data_parallel or not _gathers(ctx):
        return False
    return _feeds_whole_set_evaluator(ctx, iterator)


def _scattered_datasets(ctx: FileContext, site: _WholeSet) -> list[str]:
    """The datasets of this evaluator's iterators that the plan (or the source) scatters."""
    scatters = {vocab.last(name) for name in vocab.SCATTER_FUNCTIONS}
    iterators = list(site.inline)
    for fact in ctx.facts.assigns:
        if set(fact.targets) & site.names and isinstance(fact.value, cst.Call):
            iterators.append(fact.value)
    inserted = [
        ctx.code(stmt)
        for stmts in (*ctx.plan.before.values(), *ctx.plan.after.values())
        for stmt in stmts
    ]
    found = []
    for it in iterators:
        arg = dataset_arg(it)
        if arg is None:
            continue
        if id(arg) in ctx.plan.replace:  # scattered inline
            found.append(ctx.code(arg.value))
            continue
        if not isinstance(arg.value, cst.Name):
            continue
        name = arg.value.value
        planned = any(
            code.startswith(f"{name} = ") and any(f"{s}(" in code for s in scatters)
            for code in inserted
        )
        existing = any(
            (made := ctx.facts.call_of(a.value)) is not None and vocab.is_scatter(made.qname)
            for a in ctx.facts.assigns_of(name)
        )
        if planned or existing:
            found.append(name)
    return found


# ---------------------------------------------------------------------------------- plan
_LINE = 79  # a wrapped call longer than this breaks, as black would


def _wrap_gathering(func: str, comm: str, lead: str, column: int) -> NodeFn:
    """``X(...)`` -> ``func(X(...), comm, gather=True)``; ``lead``/``column``: the indentation
    of the line the call starts on and the call's column, to break long lines under it."""
    tail = f", {comm}, {vocab.GATHER_KEYWORD}=True)"

    def newline() -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(),
            indent=False,
            last_line=cst.SimpleWhitespace(lead + "    "),
        )

    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.BaseExpression)
        inner = cst.Module([]).code_for_node(node)
        one_line = column + len(func) + 1 + len(inner) + len(tail) <= _LINE
        broken = not one_line and "\n" not in inner
        after_inner: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace(" ")
        if broken and len(lead) + 4 + len(inner) + len(tail) > _LINE:
            after_inner = newline()
        return cst.Call(
            func=expression(func),
            whitespace_before_args=newline() if broken else cst.SimpleWhitespace(""),
            args=[
                cst.Arg(node, comma=cst.Comma(whitespace_after=after_inner)),
                cst.Arg(
                    expression(comm), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                ),
                cst.Arg(
                    cst.Name("True"),
                    keyword=cst.Name(vocab.GATHER_KEYWORD),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""),
                    ),
                ),
            ],
        )

    return fn


def _layout(ctx: FileContext, node: cst.CSTNode) -> tuple[str, int]:
    """The indentation of the line ``node`` starts on, and its column there."""
    positions = ctx.wrapper.resolve(PositionProvider)
    position = positions.get(node)
    if position is None:
        return "", 0
    line = ctx.source.splitlines()[position.start.line - 1]
    return line[: len(line) - len(line.lstrip())], int(position.start.column)


def _why_whole_set(call: CallFact, classes: dict[str, bool]) -> str:
    name = vocab.last(call.qname)
    if call.qname in classes:
        return f"{name} overrides evaluate(): its metric need not be a mean over batches"
    return f"{name} computes its metric over the whole test set (not a mean over batches)"


def _note_whole_set_unwrapped(
    ctx: FileContext, call: CallFact, classes: dict[str, bool], sites: dict[int, _WholeSet]
) -> None:
    """``--target chainermn``: the evaluator stays as it is and must see the whole test set."""
    why = f"{_why_whole_set(call, classes)}, and ChainerMN 7.8.1 cannot gather what an arbitrary evaluate() reads"
    scattered = _scattered_datasets(ctx, sites[id(call.node)])
    if scattered:
        ctx.note(
            call.node,
            "evaluator",
            "needs-person",
            f"{why}: its test set ({', '.join(scattered)}) is scattered, so each rank would "
            "report its own shard's metric; keep that test set whole on every rank, or convert "
            "with --target mnify (create_multi_node_evaluator(..., gather=True))",
        )
        return
    ctx.note(
        call.node,
        "evaluator",
        "info",
        f"{why}: left unwrapped with its test set not scattered, so every rank evaluates the "
        "whole test set and reports the same value",
    )


def _gathers_already(wrapper: cst.Call) -> bool:
    return any(
        a.keyword is not None and a.keyword.value == vocab.GATHER_KEYWORD for a in wrapper.args
    )


def _add_gather(node: cst.CSTNode) -> cst.CSTNode:
    """``create_multi_node_evaluator(ev, comm)`` -> ``...(ev, comm, gather=True)``."""
    assert isinstance(node, cst.Call)
    args = list(node.args)
    args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    args.append(
        cst.Arg(
            cst.Name("True"),
            keyword=cst.Name(vocab.GATHER_KEYWORD),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
    )
    return node.with_changes(args=args)


def _gather_existing_wrapper(ctx: FileContext, call: CallFact, classes: dict[str, bool]) -> None:
    """A whole-set evaluator someone wrapped in the averaging evaluator (``mnify lint --fix``,
    or a conversion with the already-distributed check off): averaging its metric is wrong."""
    wrapper = call.parent_call
    if wrapper is None or _gathers_already(wrapper):
        return
    if not vocab.is_mnify_runtime_name(call.parent_qname):
        ctx.note(
            call.node,
            "evaluator",
            "needs-person",
            f"{_why_whole_set(call, classes)}, but ChainerMN's create_multi_node_evaluator "
            "averages it over the ranks' shards: evaluate the whole test set on every rank, "
            "or subclass GenericMultiNodeEvaluator (calc_local/aggregate)",
        )
        return
    ctx.plan.replace_node(wrapper, _add_gather, call.stmt)
    ctx.note(
        call.node,
        "evaluator",
        "changed",
        f"{_why_whole_set(call, classes)}: its multi-node evaluator now gathers "
        "(gather=True) instead of averaging the ranks' shards",
    )


def _lift_to_trainer(ctx: FileContext, call: CallFact) -> bool:
    """``trainer.extend(Evaluator(...))`` in a helper given the trainer: converted where the
    helper is called (``distribute_extensions``, call_sites)."""
    extend = ctx.facts.call_of(call.parent_call)
    if extend is None or extend.method != "extend" or ctx.options.target != "mnify":
        return False
    if not extend.node.args or extend.node.args[0].value is not call.node:
        return False
    param = ctx.trainer_parameter(call.func, extend.receiver)
    return param is not None and ctx.lift(call.func, "extensions", "Evaluator", call.node, param)


@rewrite("evaluator", order=60, fixes=("MN505",), code="MN805")
def plan(ctx: FileContext) -> None:
    if not ctx.options.data_parallel:
        return
    _check_early_stopping(ctx)
    _check_hand_written_evaluation(ctx)
    wrap = ctx.spell.top("create_multi_node_evaluator")
    classes = evaluator_classes(ctx)
    sites = {id(site.call.node): site for site in _whole_set_sites(ctx)}
    for call in ctx.facts.calls:
        if isinstance(call.node.func, cst.Call):
            continue  # ``Evaluator(...)()``: the evaluator is the inner call, wrapped once
        kind = _kind(call, classes)
        if kind is None or ctx.suppressed(call.node, "evaluator"):
            continue
        if vocab.is_multi_node_evaluator_factory(call.parent_qname):
            if kind == "whole-set":
                _gather_existing_wrapper(ctx, call, classes)
            continue  # converted before
        if kind == "whole-set" and not _gathers(ctx):
            _note_whole_set_unwrapped(ctx, call, classes, sites)
            continue
        gather = kind == "whole-set"
        comm = ctx.comm_at(call.func, "Evaluator")
        if comm is None and _lift_to_trainer(ctx, call):
            continue
        if comm is None:
            shown = f"{wrap}(..., comm{', gather=True' if gather else ''})"
            ctx.note(
                call.node,
                "evaluator",
                "needs-person",
                f"Evaluator built where the communicator cannot be passed: wrap it with {shown}",
            )
            continue
        ctx.use_runtime()
        if gather:
            lead, column = _layout(ctx, call.node)
            ctx.plan.replace_node(call.node, _wrap_gathering(wrap, comm, lead, column), call.stmt)
            ctx.note(
                call.node,
                "evaluator",
                "changed",
                f"{_why_whole_set(call, classes)}: -> {wrap}(..., comm, gather=True): every rank "
                "evaluates its shard, rank 0 computes the metric over all shards' predictions "
                "and every rank reports it",
            )
            continue
        ctx.plan.replace_node(call.node, wrap_call(wrap, comm), call.stmt)
        ctx.note(call.node, "evaluator", "changed", f"Evaluator -> {wrap}(..., comm)")
