"""Where a hand-written training loop's minibatches come from, by data flow (issue 31, item 3).

The hand-loop step (``rewrites/loops.py``) follows the data of an optimizer step back through the
loop around it. This module widens what counts as "the step" and "the loop", whatever shape the
code takes:

* a **training-step function**: a function or method of the file that steps an optimizer outside
  any loop of its own (``def step(self, x, t): ...; self.opt.update()``), also through another
  such function. Its calls that sit in a loop or a comprehension are the steps there, and their
  arguments are what the loss is computed from;
* **comprehensions**: ``[step(x[b], t[b]) for b in np.array_split(perm, k)]`` is a loop whose
  ``for`` clauses bind the batch's positions;
* **batch sources**: what a loop iterates (a ``for`` header, ``next(it)``, ``iter(...)``) may be a
  generator function of the file or a class of the file with ``__iter__``, ``__next__`` or
  ``__getitem__`` (``Batches(x[:800], y[:800], 50)``): the arguments it subscripts by the
  positions it computes (the generator's parameters, or the constructor's parameters it keeps on
  ``self``) are training data, also when they are expressions; ``np.array_split(x, k)`` and
  ``np.split`` cut their first argument into batches.

"Trains" is a local, file-level query here (an update call in the function, or a call of another
function of the file that trains); ``mnify/program/effects.py`` answers the same question across
the project and installed packages, and should replace it once it is the project's.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mnify.program.facts import CallFact
from mnify.rewrites.source_file import SourceFile
from mnify.syntax import dotted_name, read_names, target_names

LOOPS = (cst.For, cst.While)
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
_ITERATION_METHODS = ("__iter__", "__next__", "next", "__getitem__")
_SPLITTERS = ("array_split", "split")


def optimizer_names(ctx: SourceFile) -> set[str]:
    """Names the file binds to an optimizer it builds."""
    return {
        t
        for a in ctx.facts.assigns
        if (fact := ctx.facts.call_of(a.value)) is not None and ctx.builds_optimizer(fact)
        for t in a.targets
    }


def is_optimizer_step(call: CallFact, optimizers: set[str]) -> bool:
    """``opt.update(...)``, ``self.optimizer.update()``: not ``dict.update`` nor
    ``Counter.update`` (the receiver is a known optimizer or is named like one)."""
    func = call.node.func
    if call.method != "update" or call.stmt is None or not isinstance(func, cst.Attribute):
        return False
    owner = (dotted_name(func.value) or "").rsplit(".", 1)[-1]
    return owner in optimizers or "opt" in owner.lower()


def in_a_loop(ctx: SourceFile, stmt: cst.BaseStatement) -> bool:
    """``stmt`` sits in a ``for``/``while`` loop of its own function."""
    current = ctx.facts.parent_statement(stmt)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.ClassDef)):
        if isinstance(current, LOOPS):
            return True
        current = ctx.facts.parent_statement(current)
    return False


def repeated(ctx: SourceFile, call: CallFact) -> bool:
    """``call`` runs repeatedly within one call of its function: in a loop or a comprehension."""
    assert call.stmt is not None
    return in_a_loop(ctx, call.stmt) or bool(comprehension_clauses(call.stmt, call.node))


@dataclass(frozen=True)
class StepFunction:
    """A function of the file that steps an optimizer once per call (no loop of its own)."""

    func: cst.FunctionDef
    cls: cst.ClassDef | None  # its class, for a method


def step_functions(ctx: SourceFile) -> list[StepFunction]:
    """The file's training-step functions, in source order: an optimizer step outside any loop
    of the function, or a call outside loops of another training-step function of the file."""
    optimizers = optimizer_names(ctx)
    found: dict[int, StepFunction] = {}
    for call in ctx.facts.calls:
        func = call.func
        if func is None or id(func) in found or not is_optimizer_step(call, optimizers):
            continue
        assert call.stmt is not None
        if not repeated(ctx, call):
            found[id(func)] = StepFunction(func, ctx.facts.func_class.get(id(func)))
    changed = True
    while changed:  # a function that calls a step function once per call steps too
        changed = False
        for call in ctx.facts.calls:
            func = call.func
            if func is None or id(func) in found or call.stmt is None:
                continue
            if any(calls_function(ctx, call, s) for s in found.values()) and not repeated(
                ctx, call
            ):
                found[id(func)] = StepFunction(func, ctx.facts.func_class.get(id(func)))
                changed = True
    order = {id(f): i for i, f in enumerate(ctx.facts.module_functions.values())}
    return sorted(found.values(), key=lambda s: (order.get(id(s.func), -1), ctx.line(s.func)))


def calls_function(ctx: SourceFile, call: CallFact, target: StepFunction) -> bool:
    """Whether ``call`` calls ``target``: a module function by name; a method through ``self``
    in its own class, or through a name the calling function binds to the class
    (``runner = Runner(...)``; ``runner.step(x, t)``)."""
    name = target.func.name.value
    if target.cls is None:
        if ctx.facts.func_parent.get(id(target.func)) is not None:
            return False  # a nested function: not reachable by name from elsewhere
        return call.qname.lstrip(".") in (name, f"{ctx.module_name}.{name}")
    func = call.node.func
    if not isinstance(func, cst.Attribute) or func.attr.value != name:
        return False
    receiver = func.value
    if isinstance(receiver, cst.Name) and receiver.value == "self":
        return call.cls is target.cls
    if not isinstance(receiver, cst.Name):
        return False
    own = (target.cls.name.value, f"{ctx.module_name}.{target.cls.name.value}")
    made = [
        ctx.facts.call_of(a.value)
        for a in ctx.facts.assigns_of(receiver.value)
        if a.func is call.func and a.stmt is not None
    ]
    return bool(made) and all(m is not None and m.qname.lstrip(".") in own for m in made)


def comprehension_clauses(stmt: cst.CSTNode, node: cst.CSTNode) -> list[cst.CompFor]:
    """The ``for`` clauses of the comprehensions of ``stmt`` that ``node`` runs inside,
    outermost first (a call in the element runs inside every clause of its comprehension)."""
    found: list[cst.CompFor] = []

    class _Visitor(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.stack: list[cst.CompFor] = []
            self.done = False

        def on_visit(self, n: cst.CSTNode) -> bool:
            if self.done:
                return False
            if n is node:
                found.extend(self.stack)
                self.done = True
                return False
            if isinstance(n, _COMPREHENSIONS):
                clauses: list[cst.CompFor] = []
                clause: cst.CompFor | None = n.for_in
                while clause is not None:
                    clauses.append(clause)
                    clause = clause.inner_for_in
                # the first clause's iterable is evaluated outside the comprehension
                clauses[0].iter.visit(self)
                self.stack.extend(clauses)
                for part in _comprehension_inside(n):
                    part.visit(self)
                del self.stack[len(self.stack) - len(clauses) :]
                return False
            return not isinstance(n, (cst.FunctionDef, cst.ClassDef, cst.Lambda))

    stmt.visit(_Visitor())
    return found


def _comprehension_inside(comp: cst.CSTNode) -> list[cst.CSTNode]:
    """What runs inside a comprehension's clauses: the element(s), the later iterables, the
    conditions."""
    assert isinstance(comp, _COMPREHENSIONS)
    parts: list[cst.CSTNode] = []
    if isinstance(comp, cst.DictComp):
        parts += [comp.key, comp.value]
    else:
        parts.append(comp.elt)
    clause: cst.CompFor | None = comp.for_in
    first = True
    while clause is not None:
        if not first:
            parts.append(clause.iter)
        parts.extend(c.test for c in clause.ifs)
        first = False
        clause = clause.inner_for_in
    return parts


def step_sites(ctx: SourceFile, steps: list[StepFunction]) -> list[CallFact]:
    """Calls of training-step functions that run in a loop or a comprehension of the calling
    function (the loop there feeds the step), one per call, in source order."""
    found: list[CallFact] = []
    for call in ctx.facts.calls:
        if call.stmt is None or not any(calls_function(ctx, call, s) for s in steps):
            continue
        if call.func is not None and any(s.func is call.func for s in steps):
            continue  # a step function calling another once: its own callers are the sites
        if repeated(ctx, call):
            found.append(call)
    return found


# ------------------------------------------------------------------------- batch sources
def _params(func: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in func.params.params]


def _subscripted_by_own(body: cst.CSTNode, bound: set[str]) -> list[cst.Subscript]:
    """Subscripts in ``body`` whose index mentions a name in ``bound``."""
    found: list[cst.Subscript] = []

    class _Visitor(cst.CSTVisitor):
        def visit_Subscript(self, n: cst.Subscript) -> None:
            for element in n.slice:
                if read_names(element.slice) & bound:
                    found.append(n)
                    return

    body.visit(_Visitor())
    return found


def _bound(func: cst.FunctionDef) -> set[str]:
    """Names a function binds (its parameters but ``self``, assignments, loop targets)."""
    found = set(_params(func)) - {"self"}

    class _Visitor(cst.CSTVisitor):
        def visit_AssignTarget(self, n: cst.AssignTarget) -> None:
            found.update(target_names(n.target))

        def visit_AugAssign(self, n: cst.AugAssign) -> None:
            found.update(target_names(n.target))

        def visit_For(self, n: cst.For) -> None:
            found.update(target_names(n.target))

        def visit_CompFor(self, n: cst.CompFor) -> None:
            found.update(target_names(n.target))

    func.body.visit(_Visitor())
    return found


def _argument(call: cst.Call, params: list[str], param: str) -> cst.BaseExpression | None:
    """The expression a call passes for ``param`` (None: not given, or behind ``*``)."""
    index = params.index(param)
    for i, arg in enumerate(call.args):
        if arg.star:
            return None
        if (arg.keyword.value == param) if arg.keyword is not None else i == index:
            return arg.value
    return None


def _generator_data(func: cst.FunctionDef, call: cst.Call) -> list[cst.BaseExpression] | None:
    """A generator function's data: the arguments given for the parameters it subscripts by
    names it binds itself (``yield inputs[pick]``). None: not a generator."""
    yields: list[cst.Yield] = []

    class _Visitor(cst.CSTVisitor):
        def visit_Yield(self, n: cst.Yield) -> None:
            yields.append(n)

        def visit_FunctionDef(self, n: cst.FunctionDef) -> bool:
            return n is func

    func.visit(_Visitor())
    if not yields:
        return None
    params = _params(func)
    inner = _bound(func) - set(params)
    indexed = {
        sub.value.value
        for sub in _subscripted_by_own(func.body, inner)
        if isinstance(sub.value, cst.Name) and sub.value.value in params
    }
    found = []
    for param in params:
        if param in indexed:
            given = _argument(call, params, param)
            if given is not None:
                found.append(given)
    return found


def _class_data(cls: cst.ClassDef, call: cst.Call) -> list[cst.BaseExpression] | None:
    """An iterable class's data: the constructor arguments it keeps on ``self`` (``self.x = x``)
    and subscripts in ``__iter__``/``__next__``/``__getitem__`` by positions it computes there.
    None: the class is not iterable."""
    methods = {
        s.name.value: s
        for s in (cls.body.body if isinstance(cls.body, cst.IndentedBlock) else [])
        if isinstance(s, cst.FunctionDef)
    }
    iterating = [methods[m] for m in _ITERATION_METHODS if m in methods]
    init = methods.get("__init__")
    if not iterating or init is None:
        return None
    params = _params(init)
    kept: dict[str, str] = {}  # attribute -> the __init__ parameter it keeps

    class _Keeps(cst.CSTVisitor):
        def visit_Assign(self, n: cst.Assign) -> None:
            values: list[cst.BaseExpression] = [n.value]
            targets: list[cst.BaseExpression] = [t.target for t in n.targets]
            if (
                len(targets) == 1
                and isinstance(targets[0], cst.Tuple)
                and isinstance(n.value, cst.Tuple)
                and len(targets[0].elements) == len(n.value.elements)
            ):
                values = [e.value for e in n.value.elements]
                targets = [e.value for e in targets[0].elements]
            for target, value in zip(targets, values, strict=False):
                if (
                    isinstance(target, cst.Attribute)
                    and isinstance(target.value, cst.Name)
                    and target.value.value == "self"
                ):
                    given = read_names(value) & set(params[1:])
                    if len(given) == 1:
                        kept[target.attr.value] = given.pop()

    init.body.visit(_Keeps())
    indexed: list[str] = []
    for method in iterating:
        for sub in _subscripted_by_own(method.body, _bound(method)):
            value = sub.value
            if (
                isinstance(value, cst.Attribute)
                and isinstance(value.value, cst.Name)
                and value.value.value == "self"
                and value.attr.value in kept
                and kept[value.attr.value] not in indexed
            ):
                indexed.append(kept[value.attr.value])
    found = []
    for param in params[1:]:
        if param in indexed:
            given = _argument(call, params[1:], param)
            if given is not None:
                found.append(given)
    return found


def source_data(ctx: SourceFile, call: cst.Call) -> list[cst.BaseExpression] | None:
    """The data a call of the file's own generator function or iterable class cuts batches from
    (its arguments, in parameter order); None when the call is neither."""
    name = (dotted_name(call.func) or "").lstrip(".")
    func = ctx.facts.module_functions.get(name)
    if func is not None:
        return _generator_data(func, call)
    cls = ctx.facts.classes.get(name)
    if cls is not None:
        return _class_data(cls, call)
    return None


def split_data(call: cst.Call) -> cst.BaseExpression | None:
    """``np.array_split(x, k)`` / ``np.split(x, k)``: what is cut into batches."""
    name = dotted_name(call.func) or ""
    if name.rsplit(".", 1)[-1] not in _SPLITTERS or not call.args or call.args[0].keyword:
        return None
    return call.args[0].value


def unwrap_iter(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``iter(X)`` -> ``X``; ``enumerate(X)`` -> ``X``."""
    while (
        isinstance(expr, cst.Call)
        and dotted_name(expr.func) in ("iter", "enumerate")
        and expr.args
        and expr.args[0].keyword is None
    ):
        expr = expr.args[0].value
    return expr
