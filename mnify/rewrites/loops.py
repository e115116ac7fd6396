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
``loop.py`` called each epoch from ``train.py``: scattered once, before the epoch loop). The step may
also be a call of a training-step function of the file (a function or method that updates an
optimizer once per call: ``losses = [runner.step(x[b], t[b]) for b in np.array_split(perm, k)]``),
in a loop or a comprehension, and the batches may come from the file's generator or iterable
class (``for xb, yb in Batches(x[:800], y[:800], 50)``, ``next(it)`` in a ``while`` loop) or
from ``np.array_split(x, k)`` itself (``rewrites/batch_sources.py``): data given as an
expression is scattered where it is written (``Batches(mn.scatter_dataset(x[:800], comm,
shuffle=True, seed=0), ...)``). A loop whose data the converter cannot find is reported as
needing a person, with its line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites import batch_sources
from mnify.rewrites.context import FileContext, Lift
from mnify.rewrites.edits import expression, statement
from mnify.rewrites.registry import rewrite
from mnify.syntax import calls_in, dotted_name, read_names, target_names

_STEP = "hand-loop"
_SEED = 0  # one seed for every array of a loop: their shuffles agree, so rows stay aligned
CANNOT_SEE_COMM = "the training loop's data cannot see the communicator"
_LOOPS = (cst.For, cst.While)
_COUNTERS = ("range", "xrange", "permutation", "arange")


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


@dataclass(eq=False)
class _Loop:
    """One training loop nest: its outermost statement and what feeds its optimizer step."""

    root: cst.BaseStatement
    step: CallFact
    arrays: list[str] = field(default_factory=list)  # plain names holding training data
    members: list[str] = field(default_factory=list)  # ``self.x``: attributes holding it
    counts: list[cst.BaseExpression] = field(default_factory=list)  # N in range(0, N, b)
    # data given as an expression (``Batches(x[:800], ...)``): scattered where it is written
    inline: list[cst.BaseExpression] = field(default_factory=list)
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
    return bool(read_names(root) & iterators) or any(
        vocab.is_iterator(c.qname) for c in ctx.facts.calls if _inside(ctx, c.stmt, root)
    )


def _inside(ctx: FileContext, stmt: cst.BaseStatement | None, outer: cst.BaseStatement) -> bool:
    while stmt is not None:
        if stmt is outer:
            return True
        stmt = ctx.facts.parent_statement(stmt)
    return False


def _step_calls(ctx: FileContext) -> list[CallFact]:
    """``optimizer.update(...)`` calls inside loops, and calls of the file's training-step
    functions inside loops or comprehensions (``[step(x[b], t[b]) for b in batches]``): one
    per loop nest (a statement, for a comprehension outside any loop)."""
    found: list[CallFact] = []
    roots: set[int] = set()
    optimizers = batch_sources.optimizer_names(ctx)
    for c in ctx.facts.calls:
        if not batch_sources.is_optimizer_step(c, optimizers):
            continue
        assert c.stmt is not None
        loops = _enclosing_loops(ctx, c.stmt)
        if not batch_sources.repeated(ctx, c):
            continue
        root = loops[-1] if loops else c.stmt
        if id(root) in roots:
            continue
        roots.add(id(root))
        found.append(c)
    for c in batch_sources.step_sites(ctx, batch_sources.step_functions(ctx)):
        assert c.stmt is not None
        loops = _enclosing_loops(ctx, c.stmt)
        root = loops[-1] if loops else c.stmt
        if id(root) in roots or any(_inside(ctx, c.stmt, r) for r in _roots_of(found, ctx)):
            continue
        roots.add(id(root))
        found.append(c)
    return found


def _roots_of(steps: list[CallFact], ctx: FileContext) -> list[cst.BaseStatement]:
    roots = []
    for step in steps:
        assert step.stmt is not None
        loops = _enclosing_loops(ctx, step.stmt)
        roots.append(loops[-1] if loops else step.stmt)
    return roots


def _indexed_by(sub: cst.Subscript, local: set[str]) -> bool:
    """The subscript's index mentions a name bound in the loop (a batch's positions)."""
    return any(read_names(e.slice) & local for e in sub.slice)


def _find(ctx: FileContext, step: CallFact) -> _Loop | None:
    """What the optimizer step of one loop nest trains on (None: an iterator feeds it)."""
    assert step.stmt is not None
    loops = _enclosing_loops(ctx, step.stmt)
    clauses = batch_sources.comprehension_clauses(step.stmt, step.node)
    root = loops[-1] if loops else step.stmt
    if _is_iterator_fed(ctx, root):
        return None
    loop = _Loop(root, step)
    inner = loops[0] if loops else step.stmt
    local = _bound_in([root])
    # what the loss is computed from: the step's arguments, or what backward() was called on
    needed = read_names(step.node)
    for call in calls_in(inner):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
            needed |= read_names(call.func.value)
    path: list[cst.CSTNode] = [step.node]
    on_path = {id(step.node)}
    changed = True
    chain = {id(x) for x in loops}
    on_chain = [x for x in _statements(root) if _on_chain(ctx, x, root, chain)]
    heads: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []  # (target, iterable)
    heads += [(x.target, x.iter) for x in loops if isinstance(x, cst.For)]
    heads += [(c.target, c.iter) for c in clauses]
    while changed:
        changed = False
        for s in on_chain:
            if isinstance(s, cst.SimpleStatementLine):
                for small in s.body:
                    targets = _bound_in([small])
                    if targets & needed and id(small) not in on_path:
                        path.append(small)
                        on_path.add(id(small))
                        needed |= read_names(small)
                        changed = True
        for target, iterable in heads:
            if set(target_names(target)) & needed and id(iterable) not in on_path:
                path.append(iterable)
                on_path.add(id(iterable))
                needed |= read_names(iterable)
                changed = True
    # names used to index (perm, batch = indices[k:k + b]): what they are cut from is an
    # index list, not data; it follows the data's new length where it is made from it
    indexing = {
        n
        for node in path
        for sub in _subscripts(node)
        for e in sub.slice
        for n in read_names(e.slice)
    }
    index_lists = {
        sub.value.value
        for small in path
        if isinstance(small, cst.Assign)
        and {n for t in small.targets for n in target_names(t.target)} & indexing
        for sub in _subscripts(small.value)
        if isinstance(sub.value, cst.Name)
    }
    iterated: list[cst.BaseExpression] = []  # what next()/iter() is called on
    for node in path:
        for sub in _subscripts(node):
            value = sub.value
            if not _indexed_by(sub, local):
                continue
            if isinstance(value, cst.Name) and value.value in index_lists:
                continue
            if isinstance(value, cst.Name) and value.value not in local:
                _add_array(loop, value)
            elif (
                isinstance(value, cst.Attribute)
                and isinstance(value.value, cst.Name)
                and value.value.value == "self"
            ):
                if value.attr.value not in loop.members:
                    loop.members.append(value.attr.value)
        for call in calls_in(node):
            if dotted_name(call.func) in ("next", "iter") and call.args:
                iterated.append(call.args[0].value)
            for given in batch_sources.source_data(ctx, call) or []:
                if not (read_names(given) & local):
                    _add_array(loop, given)
            if (dotted_name(call.func) or "").endswith("array_split"):
                loop.splits_batches = True
    _batch_sources(ctx, loop, path, heads, iterated, local, indexing)
    _counts(loop, [h[1] for h in heads if h[1] is not None] + path, local)
    return loop


def _add_array(loop: _Loop, expr: cst.BaseExpression) -> None:
    """Training data: a plain name is scattered where it is bound, an expression
    (``x[:800]`` given to a batch class) where it is written."""
    if isinstance(expr, cst.Name):
        if expr.value not in loop.arrays:
            loop.arrays.append(expr.value)
    elif all(e is not expr for e in loop.inline):
        loop.inline.append(expr)


def _batch_sources(
    ctx: FileContext,
    loop: _Loop,
    path: list[cst.CSTNode],
    heads: list[tuple[cst.BaseExpression, cst.BaseExpression]],
    iterated: list[cst.BaseExpression],
    local: set[str],
    indexing: set[str],
) -> None:
    """Batches drawn from what the loop iterates (``iterated``: what ``next()``/``iter()`` is
    called on in the loop): a loop header or ``next(it)`` over the file's
    generator or iterable class (also bound to a name before the loop: ``it = iter(Batches(x,
    y, 50))``), or over ``np.array_split(x, k)`` when the batches it yields are the data
    themselves, not positions that index it."""
    iterables: list[tuple[cst.BaseExpression | None, cst.BaseExpression]] = [
        (t, i) for t, i in heads if any(i is p for p in path)
    ]
    iterables += [(None, e) for e in iterated]
    for target, iterable in iterables:
        expr = batch_sources.unwrap_iter(iterable)
        if isinstance(expr, cst.Name) and expr.value not in local:
            expr = batch_sources.unwrap_iter(_value_before(ctx, loop, expr.value) or expr)
        sources = [expr]
        if isinstance(expr, cst.Call) and dotted_name(expr.func) == "zip":
            sources = [a.value for a in expr.args if not a.star]
        for source in sources:
            if not isinstance(source, cst.Call):
                continue
            for given in batch_sources.source_data(ctx, source) or []:
                if not (read_names(given) & local):
                    _add_array(loop, given)
            cut = batch_sources.split_data(source)
            positions = target is not None and bool(set(target_names(target)) & indexing)
            if cut is not None and not positions and not (read_names(cut) & local):
                if not (isinstance(cut, cst.Name) and _index_order(ctx, loop, cut.value)):
                    _add_array(loop, cut)
                    loop.splits_batches = True


def _value_before(ctx: FileContext, loop: _Loop, name: str) -> cst.BaseExpression | None:
    """The value ``name`` is bound to once, in the loop's function, outside the loop."""
    binds = [
        a
        for a in ctx.facts.assigns_of(name)
        if a.func is loop.step.func and a.stmt is not None and not _inside(ctx, a.stmt, loop.root)
    ]
    if len(binds) != 1 or not isinstance(binds[0].node, cst.Assign):
        return None
    return binds[0].value


def _index_order(ctx: FileContext, loop: _Loop, name: str) -> bool:
    """``name`` holds positions (a permutation or ``arange``), not data."""
    value = _value_before(ctx, loop, name)
    made = ctx.facts.call_of(value)
    return made is not None and vocab.last(made.qname) in ("permutation", "arange")


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


def _counts(loop: _Loop, nodes: list[cst.CSTNode], local: set[str]) -> None:
    """The example counts the training loops run over: ``N`` of ``range(0, N, b)`` and of
    ``permutation(N)`` (names bound outside the loop, or integer literals)."""
    for call in [c for n in nodes for c in calls_in(n)]:
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
    done: set[tuple[int, str, tuple[int, ...]]] = set()  # arrays scattered already
    for step in _step_calls(ctx):
        if ctx.suppressed(step.node, _STEP):
            continue
        loop = _find(ctx, step)
        if loop is None:
            continue
        if loop.members:
            _plan_members(ctx, loop)
            continue
        if not loop.arrays and not loop.inline:
            ctx.note(
                loop.root,
                _STEP,
                "needs-person",
                "this training loop steps the optimizer, but where its minibatches come from "
                "was not found: give each rank its own share of the training data (scatter_dataset) "
                "before the loop",
            )
            continue
        _plan_arrays(ctx, loop, done)


def _plan_arrays(
    ctx: FileContext, loop: _Loop, done: set[tuple[int, str, tuple[int, ...]]]
) -> None:
    """Scatter the loop's arrays (once per binding: a second loop over the same arrays trains
    on the share the first one's scatter made)."""
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
    if comm is None and func is not None and not loop.inline:
        if _plan_at_calls(ctx, loop, func) or _left_to_other_files(ctx, loop, func):
            return
    if comm is None:
        ctx.note(loop.root, _STEP, "needs-person", CANNOT_SEE_COMM)
        return
    if not loop.arrays:
        _plan_inline(ctx, loop, comm)
        return
    first = loop.arrays[0]
    names = [c.value for c in loop.counts if isinstance(c, cst.Name) and c.value not in loop.arrays]
    names = [n for n in names if _scope_binds(ctx, func, n)]
    after = _last_binding(ctx, loop.root, [*loop.arrays, *names])
    keys = {a: _binding_key(ctx, func, a) for a in loop.arrays}
    fresh = [a for a in loop.arrays if keys[a] not in done]
    done.update(keys.values())
    new = _scatters(ctx, fresh, comm)
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
    if loop.inline:
        said += "; " + _scatter_inline(ctx, loop, comm)
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


def _binding_key(
    ctx: FileContext, func: cst.FunctionDef | None, name: str
) -> tuple[int, str, tuple[int, ...]]:
    """``name`` as bound in ``func``: the statements that bind it there."""
    binds = tuple(sorted(id(a.node) for a in ctx.facts.assigns_of(name) if a.func is func))
    return (id(func), name, binds)


def _plan_inline(ctx: FileContext, loop: _Loop, comm: str) -> None:
    """Data given to a batch source as expressions only (``Batches(x[:800], y[:800], 50)``)."""
    if loop.counts:
        ctx.note(
            loop.root,
            _STEP,
            "needs-person",
            f"the training loop's data ({', '.join(ctx.code(e) for e in loop.inline)}) is "
            "scattered where it is given, but the loop's example count is not the share's "
            "length: count the share",
        )
        return
    said = _scatter_inline(ctx, loop, comm)
    if loop.splits_batches:
        said += "; a fixed number of batches per epoch now cuts the share: batches get smaller"
    ctx.note(loop.root, _STEP, "changed", said[0].upper() + said[1:])


def _scatter_inline(ctx: FileContext, loop: _Loop, comm: str) -> str:
    """Scatter each expression given as data where it is written; what the report says."""
    scatter = ctx.runtime.top("scatter_dataset")
    shown = []
    for expr in loop.inline:
        holder = _inline_holder(ctx, loop, expr)
        code = ctx.code(expr)
        value = f"{scatter}({code}, {comm}, shuffle=True, seed={_SEED})"
        ctx.plan.replace_node(expr, lambda _n, v=value: expression(v), holder)  # type: ignore[misc]
        shown.append(code)
    where = "where it is given" if len(shown) == 1 else "where they are given"
    return (
        f"the data the loop's batches are cut from ({', '.join(shown)}) is scattered {where}, "
        "each with the same fixed-seed shuffle: each rank trains on its own share"
    )


def _inline_holder(ctx: FileContext, loop: _Loop, expr: cst.CSTNode) -> cst.BaseStatement:
    """The statement that holds ``expr``: in the loop, or the one binding what it iterates."""
    holder = _holder(ctx, expr, loop.root)
    if holder is not loop.root or _header_holds(loop.root, expr):
        return holder
    for a in ctx.facts.assigns:
        if a.func is loop.step.func and a.stmt is not None and expr in _all_nodes(a.node):
            return a.stmt
    return holder


def _header_holds(stmt: cst.BaseStatement, node: cst.CSTNode) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine):
        return node in _all_nodes(stmt)
    if isinstance(stmt, cst.For):
        return node in _all_nodes(stmt.iter)
    if isinstance(stmt, (cst.If, cst.While)):
        return node in _all_nodes(stmt.test)
    return False


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
