"""Hand-written training loops: each rank trains on its own share of the arrays they index.

A loop that steps an optimizer without an iterator takes its minibatches by index: from numpy
arrays through a permutation (``x_train[perm[i:i + b]]``), from a dataset indexed by hand and
batched with ``concat_examples``, from a generator that yields slices of the arrays it is given,
or from arrays a small trainer class keeps (``self.x[idx]`` for ``idx`` in ``np.array_split``).
The data the loss is computed from is followed back from the optimizer step (its arguments, or
what ``loss.backward()`` was computed from) through the assignments in the loop; every array
subscripted on that path by a name the loop binds is training data. Each is scattered before the
loop, all with the same fixed-seed shuffle, so inputs, labels, weights and masks stay aligned::

    x_train = mn.scatter_dataset(x_train, comm, shuffle=True, seed=0)

Every rank still builds the arrays (the loading often defines what the rest needs); rank 0's copy
is the one scattered. The loop's example count follows the share: a name the loop counts with
(``range(0, N, b)``, ``permutation(N)``) is bound again to ``len(x_train)``, a literal count
becomes ``len(x_train)``. Arrays indexed only in loops that do not train (evaluation) are left
whole, so evaluation sees the whole held-out set. A loop inside a training function that indexes
its parameters (``def train_epoch(model, opt, xs, ys, b)``) has the arrays its callers pass
scattered before the call, also where the caller is another file of the tree (a v1-era
``loop.py`` called each epoch from ``train.py``: scattered once, before the epoch loop). A loop
whose data the converter cannot find is reported as needing a person, with its line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites.context import FileContext, Lift
from mnify.rewrites.edits import expression, statement
from mnify.rewrites.registry import rewrite
from mnify.syntax import dotted_name, target_names

_STEP = "hand-loop"
_SEED = 0  # one seed for every array of a loop: their shuffles agree, so rows stay aligned
CANNOT_SEE_COMM = "the training loop's data cannot see the communicator"
_LOOPS = (cst.For, cst.While)
_COUNTERS = ("range", "xrange", "permutation", "arange")


def _names(node: cst.CSTNode) -> set[str]:
    """Plain names read in ``node`` (not attribute names after a dot)."""
    found: set[str] = set()

    class _Visitor(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.add(n.value)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)
            return False

    node.visit(_Visitor())
    return found


def _bound_in(nodes: list[cst.CSTNode]) -> set[str]:
    """Names assigned or used as loop targets anywhere in ``nodes``."""
    found: set[str] = set()

    class _Visitor(cst.CSTVisitor):
        def visit_AssignTarget(self, n: cst.AssignTarget) -> None:
            found.update(target_names(n.target))

        def visit_AugAssign(self, n: cst.AugAssign) -> None:
            found.update(target_names(n.target))

        def visit_AnnAssign(self, n: cst.AnnAssign) -> None:
            found.update(target_names(n.target))

        def visit_For(self, n: cst.For) -> None:
            found.update(target_names(n.target))

        def visit_CompFor(self, n: cst.CompFor) -> None:
            found.update(target_names(n.target))

        def visit_WithItem(self, n: cst.WithItem) -> None:
            if n.asname is not None:
                found.update(target_names(n.asname.name))

    for node in nodes:
        node.visit(_Visitor())
    return found


def _subscripts(node: cst.CSTNode) -> list[cst.Subscript]:
    found: list[cst.Subscript] = []

    class _Visitor(cst.CSTVisitor):
        def visit_Subscript(self, n: cst.Subscript) -> None:
            found.append(n)

    node.visit(_Visitor())
    return found


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class _Visitor(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            found.append(n)

    node.visit(_Visitor())
    return found


@dataclass(eq=False)
class _Loop:
    """One training loop nest: its outermost statement and what feeds its optimizer step."""

    root: cst.BaseStatement
    step: CallFact
    arrays: list[str] = field(default_factory=list)  # plain names holding training data
    members: list[str] = field(default_factory=list)  # ``self.x``: attributes holding it
    counts: list[cst.BaseExpression] = field(default_factory=list)  # N in range(0, N, b)
    splits_batches: bool = False  # np.array_split(perm, n_batches): batches get smaller


def _enclosing_loops(ctx: FileContext, stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
    """The loops around ``stmt`` in its function, innermost first."""
    loops: list[cst.BaseStatement] = []
    current = ctx.facts.parent_statement(stmt)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.ClassDef)):
        if isinstance(current, _LOOPS):
            loops.append(current)
        current = ctx.facts.parent_statement(current)
    return loops


def _statements(node: cst.CSTNode) -> list[cst.BaseStatement]:
    """Every statement inside ``node`` (itself included), outer before inner."""
    found: list[cst.BaseStatement] = []

    class _Visitor(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if isinstance(n, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                found.append(n)  # type: ignore[arg-type]
            return not isinstance(n, (cst.FunctionDef, cst.ClassDef, cst.Lambda))

    node.visit(_Visitor())
    return found


def _is_iterator_fed(ctx: FileContext, root: cst.BaseStatement) -> bool:
    """The loop draws batches from an iterator (the dataset rewrite splits those)."""
    iterators = {
        t
        for a in ctx.facts.assigns
        if (fact := ctx.facts.call_of(a.value)) is not None
        and (vocab.is_iterator(fact.qname) or fact.qname.endswith("Iterator"))
        for t in a.targets
    }
    return bool(_names(root) & iterators) or any(
        vocab.is_iterator(c.qname) for c in ctx.facts.calls if _inside(ctx, c.stmt, root)
    )


def _inside(ctx: FileContext, stmt: cst.BaseStatement | None, outer: cst.BaseStatement) -> bool:
    while stmt is not None:
        if stmt is outer:
            return True
        stmt = ctx.facts.parent_statement(stmt)
    return False


def _step_calls(ctx: FileContext) -> list[CallFact]:
    """``optimizer.update(...)`` calls inside loops, one per loop nest."""
    found: list[CallFact] = []
    roots: set[int] = set()
    optimizers = {
        t
        for a in ctx.facts.assigns
        if (fact := ctx.facts.call_of(a.value)) is not None and vocab.is_optimizer(fact.qname)
        for t in a.targets
    }
    for c in ctx.facts.calls:
        func = c.node.func
        if c.method != "update" or c.stmt is None or not isinstance(func, cst.Attribute):
            continue
        owner = (dotted_name(func.value) or "").rsplit(".", 1)[-1]
        if owner not in optimizers and "opt" not in owner.lower():
            continue  # dict.update, Counter.update: not an optimizer step
        loops = _enclosing_loops(ctx, c.stmt)
        if not loops or id(loops[-1]) in roots:
            continue
        roots.add(id(loops[-1]))
        found.append(c)
    return found


def _generator(ctx: FileContext, call: cst.Call) -> cst.FunctionDef | None:
    """The module's own generator function a ``for`` loop iterates over, if it is one."""
    name = dotted_name(call.func)
    func = ctx.facts.module_functions.get(name or "")
    if func is None:
        return None
    yields: list[cst.Yield] = []

    class _Visitor(cst.CSTVisitor):
        def visit_Yield(self, n: cst.Yield) -> None:
            yields.append(n)

        def visit_FunctionDef(self, n: cst.FunctionDef) -> bool:
            return n is func

    func.visit(_Visitor())
    return func if yields else None


def _indexed_by(sub: cst.Subscript, local: set[str]) -> bool:
    """The subscript's index mentions a name bound in the loop (a batch's positions)."""
    return any(_names(e.slice) & local for e in sub.slice)


def _find(ctx: FileContext, step: CallFact) -> _Loop | None:
    """What the optimizer step of one loop nest trains on (None: an iterator feeds it)."""
    assert step.stmt is not None
    loops = _enclosing_loops(ctx, step.stmt)
    root = loops[-1]
    if _is_iterator_fed(ctx, root):
        return None
    loop = _Loop(root, step)
    inner = loops[0]
    local = _bound_in([root])
    # what the loss is computed from: the step's arguments, or what backward() was called on
    needed = _names(step.node)
    for call in _calls(inner):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
            needed |= _names(call.func.value)
    path: list[cst.CSTNode] = [step.node]
    on_path = {id(step.node)}
    changed = True
    chain = {id(x) for x in loops}
    on_chain = [x for x in _statements(root) if _on_chain(ctx, x, root, chain)]
    while changed:
        changed = False
        for s in on_chain:
            if isinstance(s, cst.SimpleStatementLine):
                for small in s.body:
                    targets = _bound_in([small])
                    if targets & needed and id(small) not in on_path:
                        path.append(small)
                        on_path.add(id(small))
                        needed |= _names(small)
                        changed = True
            elif (
                isinstance(s, cst.For)
                and id(s) in chain
                and set(target_names(s.target)) & needed
                and id(s.iter) not in on_path
            ):
                path.append(s.iter)
                on_path.add(id(s.iter))
                needed |= _names(s.iter)
                changed = True
    # names used to index (perm, batch = indices[k:k + b]): what they are cut from is an
    # index list, not data; it follows the data's new length where it is made from it
    indexing = {
        n for node in path for sub in _subscripts(node) for e in sub.slice for n in _names(e.slice)
    }
    index_lists = {
        sub.value.value
        for small in path
        if isinstance(small, cst.Assign)
        and {n for t in small.targets for n in target_names(t.target)} & indexing
        for sub in _subscripts(small.value)
        if isinstance(sub.value, cst.Name)
    }
    for node in path:
        for sub in _subscripts(node):
            value = sub.value
            if not _indexed_by(sub, local):
                continue
            if isinstance(value, cst.Name) and value.value in index_lists:
                continue
            if isinstance(value, cst.Name) and value.value not in local:
                if value.value not in loop.arrays:
                    loop.arrays.append(value.value)
            elif (
                isinstance(value, cst.Attribute)
                and isinstance(value.value, cst.Name)
                and value.value.value == "self"
            ):
                if value.attr.value not in loop.members:
                    loop.members.append(value.attr.value)
        for call in _calls(node):
            gen = _generator(ctx, call)
            if gen is not None:
                for name in _generator_data(gen, call):
                    if name not in local and name not in loop.arrays:
                        loop.arrays.append(name)
            if (dotted_name(call.func) or "").endswith("array_split"):
                loop.splits_batches = True
    heads: list[cst.CSTNode] = [x.iter for x in loops if isinstance(x, cst.For)]
    _counts(loop, [*heads, *path], local)
    return loop


def _on_chain(
    ctx: FileContext, stmt: cst.BaseStatement, root: cst.BaseStatement, chain: set[int]
) -> bool:
    """``stmt`` runs as part of the loops around the optimizer step, not inside another loop
    of the nest (an evaluation loop beside the training one)."""
    current: cst.BaseStatement | None = stmt
    while current is not None and current is not root:
        parent = ctx.facts.parent_statement(current)
        if isinstance(parent, _LOOPS) and id(parent) not in chain:
            return False
        current = parent
    return True


def _generator_data(gen: cst.FunctionDef, call: cst.Call) -> list[str]:
    """The arguments a generator indexes by names it binds (``x[excerpt]``): its data."""
    params = [p.name.value for p in gen.params.params]
    inner = _bound_in([gen.body])
    indexed = {
        sub.value.value
        for sub in _subscripts(gen.body)
        if isinstance(sub.value, cst.Name) and _indexed_by(sub, inner)
    }
    found: list[str] = []
    for i, arg in enumerate(call.args):
        if arg.star or not isinstance(arg.value, cst.Name):
            continue
        param = (
            arg.keyword.value
            if arg.keyword is not None
            else (params[i] if i < len(params) else None)
        )
        if param in indexed:
            found.append(arg.value.value)
    return found


def _counts(loop: _Loop, nodes: list[cst.CSTNode], local: set[str]) -> None:
    """The example counts the training loops run over: ``N`` of ``range(0, N, b)`` and of
    ``permutation(N)`` (names bound outside the loop, or integer literals)."""
    for call in [c for n in nodes for c in _calls(n)]:
        name = dotted_name(call.func) or ""
        last = name.rsplit(".", 1)[-1]
        if last not in _COUNTERS:
            continue
        args = [a for a in call.args if a.keyword is None and not a.star]
        if last in ("range", "xrange", "arange"):
            if len(args) < 3:
                continue  # range(n_batches): a count of batches, not of examples
            count = args[1].value
        else:
            if not args:
                continue
            count = args[0].value
        if isinstance(count, cst.Name) and count.value not in local:
            if all(not (isinstance(c, cst.Name) and c.value == count.value) for c in loop.counts):
                loop.counts.append(count)
        elif isinstance(count, cst.Integer):
            loop.counts.append(count)


def _scope_binds(ctx: FileContext, func: cst.FunctionDef | None, name: str) -> bool:
    """``name`` is a local of ``func`` (a parameter or assigned there), or a module global
    assigned at module level when ``func`` is None: a new assignment there rebinds it."""
    if func is not None and any(p.name.value == name for p in func.params.params):
        return True
    return any(a.func is func for a in ctx.facts.assigns_of(name))


@rewrite(_STEP, order=32, code="MN815")
def plan(ctx: FileContext) -> None:
    if not ctx.options.data_parallel:
        return
    for step in _step_calls(ctx):
        if ctx.suppressed(step.node, _STEP):
            continue
        loop = _find(ctx, step)
        if loop is None:
            continue
        if loop.members:
            _plan_members(ctx, loop)
            continue
        if not loop.arrays:
            ctx.note(
                loop.root,
                _STEP,
                "needs-person",
                "this training loop steps the optimizer, but where its minibatches come from "
                "was not found: give each rank its own share of the training data (scatter_dataset) "
                "before the loop",
            )
            continue
        _plan_arrays(ctx, loop)


def _plan_arrays(ctx: FileContext, loop: _Loop) -> None:
    func = loop.step.func
    if id(loop.root) in ctx.facts.under_rank_test:
        ctx.note(loop.root, _STEP, "needs-person", "this training loop runs under a rank check")
        return
    strangers = [a for a in loop.arrays if not _scope_binds(ctx, func, a)]
    if strangers:
        ctx.note(
            loop.root,
            _STEP,
            "needs-person",
            f"the training loop indexes {', '.join(strangers)}, bound outside its function: "
            "scatter it where it is made",
        )
        return
    comm = ctx.comm_at(func, _STEP)
    if comm is None and func is not None and _plan_at_calls(ctx, loop, func):
        return
    if comm is None and func is not None and _left_to_other_files(ctx, loop, func):
        return
    if comm is None:
        ctx.note(loop.root, _STEP, "needs-person", CANNOT_SEE_COMM)
        return
    first = loop.arrays[0]
    names = [c.value for c in loop.counts if isinstance(c, cst.Name) and c.value not in loop.arrays]
    names = [n for n in names if _scope_binds(ctx, func, n)]
    after = _last_binding(ctx, loop.root, [*loop.arrays, *names])
    new = _scatters(ctx, loop.arrays, comm)
    new += [statement(f"{n} = len({first})\n") for n in names]
    if after is None:
        ctx.plan.insert_before(loop.root, new)
    else:
        ctx.plan.insert_after(after, new)
    counted = list(names)
    for count in loop.counts:
        if isinstance(count, cst.Name):
            continue
        else:
            holder = _holder(ctx, count, loop.root)
            ctx.plan.replace_node(count, lambda _n: expression(f"len({first})"), holder)
            counted.append(ctx.code(count))
    said = f"the hand-written training loop's data {', '.join(loop.arrays)} is scattered: each "
    said += "rank trains on its own share (rank 0's copy, shuffled with one seed so rows align)"
    if counted:
        said += f"; the loop's example count ({', '.join(counted)}) is now the share's length"
    if loop.splits_batches:
        said += "; a fixed number of batches per epoch now cuts the share: batches get smaller"
    _note_built_everywhere(ctx, loop.root, loop.arrays)
    for name in loop.arrays:
        ctx.note(
            loop.root,
            _STEP,
            "changed",
            said if name == first else f"{name} scattered",
            claim=("scattered", name),
        )


def _holder(ctx: FileContext, node: cst.CSTNode, root: cst.BaseStatement) -> cst.BaseStatement:
    """The innermost statement of ``root`` holding ``node``."""
    best = root
    for s in _statements(root):
        if isinstance(s, cst.SimpleStatementLine) or isinstance(s, cst.BaseCompoundStatement):
            header: list[cst.CSTNode]
            if isinstance(s, cst.SimpleStatementLine):
                header = [s]
            elif isinstance(s, cst.For):
                header = [s.iter, s.target]
            elif isinstance(s, (cst.If, cst.While)):
                header = [s.test]
            else:
                continue
            if any(node in _all_nodes(h) for h in header):
                best = s
    return best


def _all_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []

    class _Visitor(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            found.append(n)
            return True

    node.visit(_Visitor())
    return found


EVERY_RANK_BUILDS = "every rank builds "


def _note_built_everywhere(ctx: FileContext, node: cst.CSTNode, arrays: list[str]) -> None:
    """Loading stays on every rank (what builds the arrays often builds more that every rank
    needs); the report says so once per array, in place of lint's MN501 advice."""
    for name in arrays:
        ctx.note(
            node,
            _STEP,
            "info",
            f"{EVERY_RANK_BUILDS}{name} as the script does; rank 0's copy is the one scattered",
        )


def _scatters(ctx: FileContext, arrays: list[str], comm: str) -> list[cst.BaseStatement]:
    scatter = ctx.runtime.top("scatter_dataset")
    return [
        statement(f"{a} = {scatter}({a}, {comm}, shuffle=True, seed={_SEED})\n") for a in arrays
    ]


def _scatter_before(
    ctx: FileContext, where: cst.BaseStatement, arrays: list[str], comm: str
) -> None:
    ctx.plan.insert_before(where, _scatters(ctx, arrays, comm))


def _last_binding(
    ctx: FileContext, root: cst.BaseStatement, names: list[str]
) -> cst.BaseStatement | None:
    """The last statement before ``root`` in its block that binds one of ``names``: the split
    goes right after it, before anything derived from the data's size (a permutation made
    before the loop) is computed. None: right before the loop."""
    block = ctx.facts.block_of.get(id(root))
    if block is None:
        return None
    body = list(block.body)
    binds = {id(a.stmt) for n in names for a in ctx.facts.assigns_of(n) if a.stmt is not None}
    last = None
    for stmt in body[: body.index(root)]:
        inner = [stmt, *_statements(stmt)]
        if any(id(x) in binds for x in inner):
            last = stmt
    if last is None or ctx.before_comm_exists(last) or id(last) in ctx.facts.under_rank_test:
        return None
    if not isinstance(last, cst.SimpleStatementLine):
        return None  # bound inside a branch or loop: split right before the training loop
    return last


def _plan_at_calls(ctx: FileContext, loop: _Loop, func: cst.FunctionDef) -> bool:
    """A training function whose loop indexes its parameters (``def train(model, x, y)``):
    the arrays its callers pass are scattered before each call, where the communicator is."""
    params = [p.name.value for p in func.params.params]
    if not all(a in params for a in loop.arrays):
        return False
    calls = [
        c
        for c in ctx.facts.calls
        if c.qname.lstrip(".") in (func.name.value, f"{ctx.module_name}.{func.name.value}")
        and c.stmt is not None
    ]
    planned = []
    for call in calls:
        given = [_argument_name(call.node, params, p) for p in loop.arrays]
        names = [n for n in given if n is not None]
        comm = ctx.comm_at(call.func, _STEP)
        if comm is None or len(names) < len(given):
            return False
        if not all(_scope_binds(ctx, call.func, n) for n in names):
            return False
        planned.append((call, names, comm))
    if not planned:
        return False
    for call, names, comm in planned:
        assert call.stmt is not None
        _scatter_before(ctx, call.stmt, names, comm)
        _note_built_everywhere(ctx, call.node, names)
        said = (
            f"{func.name.value} trains by hand on {', '.join(names)}: they are scattered before "
            "the call, so each rank trains on its own share"
        )
        for name in names:
            ctx.note(call.node, _STEP, "changed", said, claim=("scattered", name))
    return True


def _left_to_other_files(ctx: FileContext, loop: _Loop, func: cst.FunctionDef) -> bool:
    """A module-level training function of a file that calls it nowhere itself, whose loop
    indexes its parameters (``loop.train_epoch(model, opt, x_train, y_train, b)`` called from
    the entry point of another file): :func:`plan_project` scatters at those calls."""
    params = [p.name.value for p in func.params.params]
    data = [a for a in loop.arrays if a in params]
    if (
        ctx.outermost_scope(func) is not func
        or ctx.facts.func_class.get(id(func)) is not None
        or not data
        or not all(a in params or _index_array(ctx, func, a) for a in loop.arrays)
    ):
        return False
    lift = Lift(func.name.value, "loop-data", ",".join(data), loop.root, ctx.module_name)
    ctx.lifts.append(lift)
    return True


def _index_array(ctx: FileContext, func: cst.FunctionDef, name: str) -> bool:
    """``perm = np.random.permutation(N)`` in ``func``: an order over the data, not data; it
    follows the share once ``N`` is the share's length."""
    assigns = [a for a in ctx.facts.assigns_of(name) if a.func is func]
    made = [ctx.facts.call_of(a.value) for a in assigns]
    return bool(made) and all(
        m is not None and vocab.last(m.qname) in ("permutation", "arange") for m in made
    )


def plan_project(contexts: Mapping[str, FileContext]) -> None:
    """Training functions of one file whose loops index arrays that other files pass them: the
    arrays are scattered in the caller, before the outermost loop around the call that does not
    rebind them (an epoch loop calling ``train_epoch`` each epoch scatters once). Where some call
    cannot be planned, the loop needs a person, as in its own file."""
    from mnify.rewrites.call_sites import matches

    for owner in contexts.values():
        for lift in [lift for lift in owner.lifts if lift.kind == "loop-data"]:
            func = owner.facts.module_functions.get(lift.name)
            assert func is not None
            params = [p.name.value for p in func.params.params]
            arrays = lift.label.split(",")
            planned: list[tuple[FileContext, CallFact, list[str], str]] = []
            complete = True
            for ctx in contexts.values():
                for call in ctx.facts.calls:
                    if ctx is owner or call.stmt is None or not matches(ctx, call, lift):
                        continue
                    given = [_argument_name(call.node, params, a) for a in arrays]
                    names = [n for n in given if n is not None]
                    comm = ctx.comm_at(call.func, _STEP)
                    if (
                        comm is None
                        or len(names) < len(given)
                        or not all(_scope_binds(ctx, call.func, n) for n in names)
                    ):
                        complete = False
                        continue
                    planned.append((ctx, call, names, comm))
            if not planned or not complete:
                owner.note(lift.node, _STEP, "needs-person", CANNOT_SEE_COMM)
                continue
            for ctx, call, names, comm in planned:
                assert call.stmt is not None
                _scatter_before(ctx, _outside_loops_keeping(ctx, call.stmt, names), names, comm)
                _note_built_everywhere(ctx, call.node, names)
                said = (
                    f"{lift.name} ({lift.module}) trains by hand on {', '.join(names)}: they are "
                    "scattered before it is called, so each rank trains on its own share"
                )
                for name in names:
                    ctx.note(call.node, _STEP, "changed", said, claim=("scattered", name))


def _outside_loops_keeping(
    ctx: FileContext, stmt: cst.BaseStatement, names: list[str]
) -> cst.BaseStatement:
    """The outermost loop around ``stmt`` (in its function) that binds none of ``names``, or
    ``stmt`` itself: scattering there happens once, not on every pass."""
    where = stmt
    for loop in _enclosing_loops(ctx, stmt):
        inner = {id(x) for x in _statements(loop)}
        if any(id(a.stmt) in inner for n in names for a in ctx.facts.assigns_of(n)):
            break
        where = loop
    return where


def _argument_name(call: cst.Call, params: list[str], param: str) -> str | None:
    """The plain name a call passes for ``param`` (None: another expression, or not given)."""
    index = params.index(param)
    for i, arg in enumerate(call.args):
        if arg.star:
            return None
        hit = arg.keyword.value == param if arg.keyword is not None else i == index
        if hit:
            return arg.value.value if isinstance(arg.value, cst.Name) else None
    return None


def _plan_members(ctx: FileContext, loop: _Loop) -> None:
    """A trainer class whose method loops over ``self.x[idx]``: its data is what its callers
    hand to ``__init__``; it is scattered where the class is built."""
    cls = loop.step.cls
    init = None
    if cls is not None and isinstance(cls.body, cst.IndentedBlock):
        for s in cls.body.body:
            if isinstance(s, cst.FunctionDef) and s.name.value == "__init__":
                init = s
    if cls is None or init is None:
        ctx.note(
            loop.root,
            _STEP,
            "needs-person",
            "the training loop reads data kept on self, set outside __init__",
        )
        return
    params = [p.name.value for p in init.params.params]
    source: dict[str, str] = {}  # member -> __init__ parameter
    for a in ctx.facts.assigns:
        if a.func is not init or not isinstance(a.node, cst.Assign):
            continue
        for t in a.node.targets:
            target = t.target
            if (
                isinstance(target, cst.Attribute)
                and isinstance(target.value, cst.Name)
                and target.value.value == "self"
                and isinstance(a.node.value, cst.Name)
                and a.node.value.value in params
            ):
                source[target.attr.value] = a.node.value.value
    missing = [m for m in loop.members if m not in source]
    if missing:
        ctx.note(
            loop.root,
            _STEP,
            "needs-person",
            f"the training loop reads self.{missing[0]}, which __init__ does not take as a "
            "parameter: scatter it where it is made",
        )
        return
    own = (cls.name.value, f"{ctx.module_name}.{cls.name.value}")
    built = [c for c in ctx.facts.calls if c.qname.lstrip(".") in own and c.stmt is not None]
    if not built:
        ctx.note(
            loop.root,
            _STEP,
            "needs-person",
            f"{cls.name.value} is built in another file: scatter its data there",
        )
        return
    for call in built:
        arrays: list[str] = []
        for member in loop.members:
            name = _argument_name(call.node, params[1:], source[member])  # params[0]: self
            if name is None:
                arrays = []
                break
            arrays.append(name)
        assert call.stmt is not None
        comm = ctx.comm_at(call.func, _STEP)
        if not arrays or comm is None or not all(_scope_binds(ctx, call.func, a) for a in arrays):
            ctx.note(
                call.node, _STEP, "needs-person", f"scatter the data given to {cls.name.value} here"
            )
            continue
        _scatter_before(ctx, call.stmt, arrays, comm)
        _note_built_everywhere(ctx, call.node, arrays)
        said = (
            f"{cls.name.value} trains by hand on {', '.join(arrays)}: they are scattered before it "
            "is built, so each rank trains on its own share"
        )
        if loop.splits_batches:
            said += (
                "; its fixed number of batches per epoch now cuts the share: batches get smaller"
            )
        for name in arrays:
            ctx.note(call.node, _STEP, "changed", said, claim=("scattered", name))
