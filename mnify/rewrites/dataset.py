"""docs/design.md §1, step "data": rank 0 loads, ``scatter_dataset`` hands out the shards.

The datasets that feed the iterators are found from the iterator constructions. In the block
that builds the iterator, the statements that load and transform those datasets are put under
``if comm.rank == 0: ... else: train, test = None, None`` (so one process reads or downloads),
then ``train = mn.scatter_dataset(train, comm, shuffle=True)`` (training data) and
``test = mn.scatter_dataset(test, comm)`` (evaluation data, ``repeat=False`` iterators) follow.
When those statements also define something every rank needs later, loading stays on every rank
(scatter still splits the data; only rank 0's copy is used) and the report says why. A dataset
given inline (``SerialIterator(train[:100], 32)``) is scattered inline. A test set read only by
hand-written evaluation loops is not scattered: ``test = comm.bcast_obj(test)`` gives every rank
all of it (step ``evaluator``, MN805). A dataset whose loading changes ``sys.path`` or imports a
module by name (the other ranks could not unpickle its class), one that only loads lazily
(Chainer's file readers, a ``DatasetMixin`` of the file reading files by index, a list of paths)
and a ``TransformDataset`` are built on every rank, each keeping its slice by index:
``train = chainer.datasets.SubDataset(train, *mn.scatter_index(len(train), comm))``; nothing is
pickled (``rewrites/dataset_loading.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites import dataset_loading, evaluator, global_data
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import Guard, NodeFn, expression, statement
from mnify.rewrites.iterators import (
    dataset_arg,
    dataset_name,
    is_training_iterator,
    iterator_calls,
)
from mnify.rewrites.registry import rewrite
from mnify.rewrites.report import Claim
from mnify.syntax import assigned_in, mentions_rank, names_in, target_names


@dataclass(eq=False)
class _BlockWork:
    body: list[cst.BaseStatement]
    func: cst.FunctionDef | None
    first_iterator: int
    datasets: dict[str, bool] = field(default_factory=dict)  # name -> shuffle (training)
    sites: list[CallFact] = field(default_factory=list)
    firsts: dict[str, int] = field(default_factory=dict)  # name -> its first iterator's index
    unequal: set[str] = field(default_factory=set)  # scattered with force_equal_length=False
    broadcast: set[str] = field(default_factory=set)  # whole on every rank (bcast_obj)


def _already_scattered(ctx: FileContext, name: str) -> bool:
    """``name = scatter_dataset(name, comm)``, or sliced by ``scatter_index`` (``SubDataset(name,
    *scatter_index(len(name), comm))``): this dataset is a shard already; or ``name =
    comm.bcast_obj(name)``: every rank has it whole (a hand-evaluated test set, converted)."""
    for a in ctx.facts.assigns_of(name):
        fact = ctx.facts.call_of(a.value)
        if fact is not None and (
            vocab.is_scatter(fact.qname)
            or fact.method == "bcast_obj"
            or global_data.is_whole_broadcast(fact.qname)
        ):
            return True
        if a.stmt is not None and any(
            vocab.is_scatter(c.qname) for c in ctx.facts.calls_by_stmt.get(id(a.stmt), [])
        ):
            return True
    return False


@rewrite("dataset", order=30, fixes=("MN504", "MN501"), code="MN804")
def plan(ctx: FileContext) -> None:
    if not ctx.options.data_parallel:
        return
    work: dict[int, _BlockWork] = {}
    unequal: set[str] = set()
    hand_evaluated = evaluator.hand_evaluated_datasets(ctx)
    for call in iterator_calls(ctx):
        arg = dataset_arg(call.node)
        stmt = call.stmt
        if arg is None or stmt is None or ctx.suppressed(call.node, "dataset"):
            continue
        # Chainer's own iterators shuffle a shard freely; another iterator may read its data in
        # order (a token stream, windows of a corpus): it gets a contiguous shard.
        train = is_training_iterator(call.node) and vocab.is_iterator(call.qname)
        whole = global_data.replaces(ctx, call)  # --data global: every rank holds all of it
        if id(stmt) in ctx.facts.under_rank_test:
            # A scatter here would run on some ranks only (a deadlock): leave it to a person.
            ctx.note(
                call.node,
                "dataset",
                "needs-person",
                "this iterator is built under a rank check: scatter its dataset where every rank "
                "runs",
            )
            continue
        if evaluator.keeps_full_test_set(ctx, call):
            continue  # a whole-set evaluator (--target chainermn) reads all of it on every rank
        if isinstance(arg.value, cst.Name):
            name = arg.value.value
            if _already_scattered(ctx, name) or (whole and global_data.built_here(ctx, name)):
                continue
            if evaluator.gathers_test_set(ctx, call):
                unequal.add(name)  # gathered again: padding would count examples twice
            stmt = _outside_loops(ctx, name, stmt)
            block = ctx.facts.block_of[id(stmt)]
            index = list(block.body).index(stmt)
            item = work.get(id(block.owner))
            if item is None:
                item = work[id(block.owner)] = _BlockWork(list(block.body), block.func, index)
            item.first_iterator = min(item.first_iterator, index)
            item.firsts[name] = min(item.firsts.get(name, index), index)
            item.datasets[name] = item.datasets.get(name, False) or train
            if name in hand_evaluated or whole:
                item.broadcast.add(name)
            item.sites.append(call)
            if not vocab.is_iterator(call.qname):
                # BalancedSerialIterator(train, batch, train_labels): per-example arrays loaded
                # with the dataset travel with it, cut into the same contiguous shard
                for companion in _companions(ctx, call, name):
                    item.firsts[companion] = min(item.firsts.get(companion, index), index)
                    item.datasets[companion] = False
        else:
            inner = ctx.facts.call_of(arg.value)
            if (inner is not None and vocab.is_scatter(inner.qname)) or whole:
                continue  # scattered inline already, or whole on every rank (--data global)
            comm = ctx.comm_at(call.func, "dataset")
            if comm is None:
                ctx.note(call.node, "dataset", "needs-person", "scatter this dataset by hand")
                continue
            scatter = ctx.runtime.top("scatter_dataset")
            shuffle = ", shuffle=True" if train else ""
            value = f"{scatter}({ctx.code(arg.value)}, {comm}{shuffle})"
            ctx.plan.replace_node(arg, _arg_value(value), call.stmt)
            ctx.note(call.node, "dataset", "changed", f"dataset scattered inline with {scatter}")
    for n, item in enumerate(work.values()):
        item.unequal = unequal & set(item.datasets)
        _plan_block(ctx, item, n)
    _plan_rank0_loading(ctx)


def _plan_rank0_loading(ctx: FileContext) -> None:
    """A dataset the script scatters itself but loads on every rank (MN501): rank 0 loads it,
    the others bind None, as when the converter writes the scatter."""
    only = ctx.options.only_codes
    if only is not None and "MN501" not in only:
        return
    for n, fact in enumerate(ctx.facts.assigns):
        call = ctx.facts.call_of(fact.value)
        stmt = fact.stmt
        if call is None or stmt is None or not vocab.is_scatter(call.qname):
            continue
        args = [a for a in call.node.args if a.keyword is None]
        if len(fact.targets) != 1 or not args or not isinstance(args[0].value, cst.Name):
            continue
        name = fact.targets[0]
        if args[0].value.value != name or id(stmt) in ctx.facts.under_rank_test:
            continue
        block = ctx.facts.block_of.get(id(stmt))
        if block is None:
            continue
        body = list(block.body)
        index = body.index(stmt)
        mine = {id(a.stmt) for a in ctx.facts.assigns_of(name) if a is not fact}
        defs = [i for i, earlier in enumerate(body[:index]) if id(earlier) in mine]
        if not defs:
            continue
        region = body[defs[0] : defs[-1] + 1]
        if any(
            id(r) in ctx.facts.under_rank_test or ctx.plan.is_guarded(r) or _is_rank_if(r)
            for r in region
        ) or ctx.suppressed(region[0], "dataset", "MN501"):
            continue
        others = assigned_in(region) - {name}
        later = names_in(body[defs[-1] + 1 :])
        if others & later:
            continue  # the loading also defines something every rank needs
        if any(name in names_in([b]) and not _is_print(ctx, b) for b in body[defs[-1] + 1 : index]):
            continue  # code before the scatter reads the whole dataset on every rank
        comm = ctx.comm_at(block.func, "dataset")
        if comm is None:
            continue
        for i, loading in enumerate(region):
            last = i == len(region) - 1
            ctx.plan.guard_stmt(loading, Guard(f"load{n}", (name,) if last else ()))
        ctx.note(
            region[0], "dataset", "changed", f"rank 0 loads {name}; the others get None", "MN501"
        )


def _is_rank_if(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.If) and mentions_rank(stmt.test)


def _plan_block(ctx: FileContext, item: _BlockWork, n: int) -> None:
    """The datasets of the iterators of one block: a post-training tail first, then each group
    of datasets loaded together (``train, test = get_mnist()``), from its own loading up to its
    own first iterator (a test set loaded after the training iterator is scattered there)."""
    comm = ctx.comm_at(item.func, "dataset")
    if comm is None:
        ctx.note(
            item.sites[0].node,
            "dataset",
            "needs-person",
            "datasets here cannot see the communicator",
        )
        return
    scatter = ctx.runtime.top("scatter_dataset")
    whole = _plan_tail(ctx, item, comm) - item.broadcast
    for d in sorted(whole):
        # the tail reads the whole dataset: scatter it where the iterators take it instead
        for call in item.sites:
            if call.stmt is not None and ctx.under_rank0_guard(call.stmt):
                continue  # an iterator of the tail itself: rank 0 reads all of it there
            arg = dataset_arg(call.node)
            if arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == d:
                value = f"{scatter}({d}, {comm}{_scatter_flags(item, d)})"
                ctx.plan.replace_node(arg, _arg_value(value), call.stmt)
    for k, group in enumerate(_groups(ctx, item)):
        first = min(item.firsts[d] for d in group)
        sub = _BlockWork(
            item.body,
            item.func,
            first,
            {d: item.datasets[d] for d in group},
            [c for c in item.sites if dataset_name(c.node) in group],
            {d: item.firsts[d] for d in group},
            item.unequal & group,
            item.broadcast & group,
        )
        _plan_group(ctx, sub, f"{n}.{k}", whole, comm, scatter)


def _outside_loops(ctx: FileContext, name: str, stmt: cst.BaseStatement) -> cst.BaseStatement:
    """Where the scatter of ``name`` belongs for an iterator built at ``stmt``: the iterator's
    own statement, unless it sits in a loop (or a branch of one) that the dataset was loaded
    before, as an evaluation iterator rebuilt every N iterations is. Then the statement of the
    dataset's block that holds the loop: the dataset is scattered once, where it was loaded."""
    assigned = {id(a.stmt) for a in ctx.facts.assigns_of(name) if a.stmt is not None}
    current: cst.BaseStatement | None = stmt
    best = stmt
    crossed_loop = False
    while current is not None:
        block = ctx.facts.block_of.get(id(current))
        if block is not None:
            earlier = list(block.body)[: list(block.body).index(current)]
            if any(id(e) in assigned for e in earlier):
                return current if crossed_loop else best
        parent = ctx.facts.parent_statement(current)
        if isinstance(parent, (cst.For, cst.While)):
            crossed_loop = True
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) or parent is None:
            break
        current = parent
    return best


def _companions(ctx: FileContext, call: CallFact, dataset: str) -> list[str]:
    """Other names an iterator takes that were bound by the statement that bound its dataset."""
    bound_by = {id(a.stmt) for a in ctx.facts.assigns_of(dataset) if a.stmt is not None}
    found = []
    for arg in call.node.args[1:]:
        value = arg.value
        if not isinstance(value, cst.Name) or value.value == dataset:
            continue
        if any(id(a.stmt) in bound_by for a in ctx.facts.assigns_of(value.value)):
            found.append(value.value)
    return found


def _scatter_flags(item: _BlockWork, name: str) -> str:
    flags = ", shuffle=True" if item.datasets[name] else ""
    if name in item.unequal:
        flags += ", force_equal_length=False"
    return flags


def _groups(ctx: FileContext, item: _BlockWork) -> list[set[str]]:
    """Datasets that share a loading statement (before their first iterators) go together."""
    groups: list[tuple[set[str], set[int]]] = []
    for d in sorted(item.datasets):
        alone = _BlockWork(item.body, item.func, item.firsts[d], {d: item.datasets[d]})
        defs = set(_defining_statements(ctx, alone, {d}))
        merged = [g for g in groups if g[1] & defs]
        names, indices = {d}, set(defs)
        for g in merged:
            names |= g[0]
            indices |= g[1]
            groups.remove(g)
        groups.append((names, indices))
    return [g[0] for g in sorted(groups, key=lambda g: (min(g[1], default=-1), sorted(g[0])))]


def _plan_group(
    ctx: FileContext,
    item: _BlockWork,
    n: str,
    whole: set[str],
    comm: str,
    scatter: str,
) -> None:
    site = item.sites[0].node
    body = item.body
    wanted = set(item.datasets)
    defs = _defining_statements(ctx, item, wanted)
    ordered = sorted(item.datasets)
    # built on every rank and sliced by index: nothing pickled (rewrites/dataset_loading.py)
    kept = {
        d: why
        for d in sorted(wanted - item.broadcast)
        if (why := dataset_loading.kept_by_index(ctx, d, body, defs)) is not None
    }
    by_index = set(kept)
    chainer = ctx.facts.local_name_of("chainer")
    if chainer is None and by_index:
        chainer = "chainer"
        ctx.imports_needed.add("import chainer")
    index_of = ctx.spell.top("scatter_index")
    scatters = [
        statement(
            f"{d} = {chainer}.datasets.SubDataset({d}, *{index_of}(len({d}), {comm}))\n"
            if d in by_index
            else f"{d} = {global_data.broadcast(ctx, d, comm)}\n"
            if d in item.broadcast
            else f"{d} = {scatter}({d}, {comm}{_scatter_flags(item, d)})\n"
        )
        for d in _in_order(ordered, body, defs)
        if d not in whole
    ]
    for d in sorted(by_index):
        ctx.note(
            site,
            "dataset",
            "info",
            f"{d} {kept[d]}: every rank builds it and keeps its slice by index ({index_of}), "
            "so nothing is pickled",
        )
    label = ", ".join(_in_order(ordered, body, defs))

    def scattered(names: list[str]) -> str:
        """What the report says is done to ``names``: the function that really shards each."""
        by_scatter = [d for d in names if d not in by_index and d not in item.broadcast]
        by_slice = [d for d in names if d in by_index]
        whole = [d for d in names if d in item.broadcast]
        parts = [f"scatter {', '.join(by_scatter)} with {scatter}"] if by_scatter else []
        if by_slice:
            parts.append(f"slice {', '.join(by_slice)} by {index_of}")
        if whole:
            why = "--data global" if ctx.options.global_data else "evaluated by hand"
            sent = "bcast_dataset" if global_data.shares_arrays(ctx) else "bcast_obj"
            parts.append(f"hand {', '.join(whole)} whole to every rank with {sent} ({why})")
        return "; ".join(parts)

    said = scattered(_in_order(ordered, body, defs))
    if not scatters:
        ctx.note(site, "dataset", "changed", f"scatter {label} where the iterators take it")
        if not defs:
            return
    if not defs:
        unbound = [d for d in ordered if not _assigned_before(ctx, d, body[item.first_iterator])]
        if unbound:
            ctx.note(
                site,
                "dataset",
                "needs-person",
                f"{', '.join(unbound)} is not surely assigned before this iterator (assigned later, "
                "or only in some branches): scatter it by hand where it is assigned",
            )
            return
        ctx.plan.insert_before(body[item.first_iterator], scatters)
        ctx.note(site, "dataset", "changed", said)
        return
    start, end = defs[0], defs[-1]
    anchor = ctx.entry.anchor if ctx.entry is not None else None
    where = next((i for i, stmt in enumerate(body) if stmt is anchor), None)
    if where is not None and where >= start:
        ctx.plan.insert_after(body[max(end, where)], scatters)
        ctx.note(
            body[start],
            "dataset",
            "info",
            "datasets are loaded before the communicator exists: every rank loads them, "
            "rank 0's copy is scattered",
        )
        ctx.note(site, "dataset", "changed", said)
        return
    first = item.first_iterator
    readers = [
        stmt
        for stmt in body[end + 1 : first]
        if names_in([stmt]) & wanted and not _is_print(ctx, stmt)
    ]
    later = names_in(body[end + 1 :])
    units = (
        None if readers or by_index else _loading_units(ctx, body[start : end + 1], wanted, later)
    )
    if units is None:
        # Code between the loading and the iterators reads the datasets (a vocabulary size,
        # say), or the loading defines more than the datasets: every rank loads, and the
        # scatter goes right before the iterators so that code still sees the whole data.
        ctx.plan.insert_before(body[first], scatters)
        if readers:
            why = f"line {ctx.line(readers[0])} reads the whole dataset before the iterators"
        elif by_index:
            why = f"{', '.join(sorted(by_index))} is built on every rank and sliced by index"
        else:
            why = "those lines also define what every rank needs"
        shared = [d for d in ordered if d not in by_index and d not in item.broadcast]
        then = (
            f"rank 0's copy of {', '.join(shared)} is scattered"
            if shared
            else "each rank keeps its own slice"
            if by_index
            else "rank 0's copy is handed whole to every rank"
        )
        ctx.note(body[start], "dataset", "info", f"every rank loads the data ({why}); {then}")
        ctx.note(site, "dataset", "changed", said)
        return
    for run in _runs(ctx, units):
        names: list[str] = []
        for _, bound in run:
            names.extend(b for b in _in_order(sorted(bound), body, defs) if b not in names)
        for i, (stmt, _) in enumerate(run):
            last = i == len(run) - 1
            ctx.plan.unguard(stmt)
            ctx.plan.guard_stmt(stmt, Guard(f"data{n}", tuple(names) if last else ()))
    # prints of the whole data between the loading and the iterators ('#tokens: %d') are rank
    # 0's, which still has it all: the scatter goes after the last of them
    told = [
        i
        for i in range(end + 1, item.first_iterator)
        if _is_print(ctx, body[i])
        and names_in([body[i]]) & wanted
        and not mentions_rank(body[i])
        and not ctx.suppressed(body[i], "rank0-guard", "MN902")
    ]
    ctx.plan.insert_after(body[max([end, *told])], scatters)
    loaded = {b for run in _runs(ctx, units) for _, bound in run for b in bound}
    for name in [d for d in ordered if d in loaded]:
        claim: Claim = ("rank0-loads", name)
        ctx.note(
            body[start],
            "dataset",
            "changed",
            f"rank 0 loads {name}; the others get None",
            claim=claim,
        )
    for name in ordered:
        claimed: Claim | None = None if name in item.broadcast else ("scattered", name)
        ctx.note(site, "dataset", "changed", scattered([name]), claim=claimed)


Unit = tuple[cst.BaseStatement, set[str]]


def _training_run(ctx: FileContext, item: _BlockWork) -> int | None:
    """Index (in the iterators' block) of the statement that trains: ``trainer.run()``, or a
    loop after the iterators that steps an optimizer or draws batches."""
    for index in range(item.first_iterator + 1, len(item.body)):
        stmt = item.body[index]
        calls = [c for c in ctx.facts.calls if _inside(ctx, c.stmt, stmt)]
        if isinstance(stmt, cst.SimpleStatementLine):
            if any(c.method == "run" and c.receiver is not None for c in calls):
                return index
        elif isinstance(stmt, (cst.For, cst.While)):
            if any(c.method in ("update", "next", "__next__") for c in calls) or any(
                c.qname in ("next", "builtins.next") for c in calls
            ):
                return index
    return None


def _inside(ctx: FileContext, stmt: cst.BaseStatement | None, outer: cst.BaseStatement) -> bool:
    while stmt is not None:
        if stmt is outer:
            return True
        stmt = ctx.facts.parent_statement(stmt)
    return False


def _plan_tail(ctx: FileContext, item: _BlockWork, comm: str) -> set[str]:
    """docs/design.md §1 "post-training tail": code after training that reads a dataset as if it were
    whole (sample images from the test set, a final accuracy over it) runs on rank 0, which keeps
    the whole dataset (the iterators get the shards); the other ranks finish. Returns the
    datasets the tail reads; a tail that also takes part in collectives is left for a person."""
    run = _training_run(ctx, item)
    if run is None:
        return set()
    tail = item.body[run + 1 :]
    wanted = set(item.datasets)
    start = next((i for i, stmt in enumerate(tail) if names_in([stmt]) & wanted), None)
    if start is None:
        return set()
    rest = tail[start:]
    read = names_in(rest) & wanted
    collective = [
        c
        for c in ctx.facts.calls
        if any(_inside(ctx, c.stmt, stmt) for stmt in rest)
        and (
            c.method in vocab.COLLECTIVE_METHODS
            or vocab.is_evaluator(c.qname)
            or c.method in ("evaluate", "update")
        )
    ]
    if collective:
        ctx.note(
            rest[0],
            "dataset",
            "needs-person",
            f"the code after training reads {', '.join(sorted(read))} as if whole and also takes "
            "part in collectives: compute over the shards on every rank, or move the collective "
            "out and run the rest on rank 0",
        )
        return set()
    for stmt in rest:
        if not ctx.plan.is_guarded(stmt) and id(stmt) not in ctx.facts.under_rank0:
            ctx.plan.guard_stmt(stmt, Guard("rank0"))
    ctx.note(
        rest[0],
        "dataset",
        "changed",
        f"the code after training reads the whole {', '.join(sorted(read))}: it runs on rank 0, "
        "which keeps the whole data (the other ranks finish)",
    )
    return read


def _is_print(ctx: FileContext, stmt: cst.BaseStatement) -> bool:
    """A print of the data (rank 0 has it all; the print is guarded to rank 0)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    fact = ctx.facts.call_of(small.value)
    return fact is not None and fact.qname in ("print", "builtins.print")


def _blocks_of(stmt: cst.BaseStatement) -> list[list[cst.BaseStatement]] | None:
    """The statement lists of a compound statement (None: not one we look into)."""

    def body(node: cst.BaseSuite) -> list[cst.BaseStatement] | None:
        return list(node.body) if isinstance(node, cst.IndentedBlock) else None

    found: list[list[cst.BaseStatement] | None] = []
    if isinstance(stmt, cst.If):
        found.append(body(stmt.body))
        orelse = stmt.orelse
        while isinstance(orelse, cst.If):
            found.append(body(orelse.body))
            orelse = orelse.orelse
        if isinstance(orelse, cst.Else):
            found.append(body(orelse.body))
    elif isinstance(stmt, cst.Try):
        found.append(body(stmt.body))
        found.extend(body(h.body) for h in stmt.handlers)
        if stmt.orelse is not None:
            found.append(body(stmt.orelse.body))
        if stmt.finalbody is not None:
            found.append(body(stmt.finalbody.body))
    elif isinstance(stmt, cst.With):
        found.append(body(stmt.body))
    else:
        return None
    if any(b is None for b in found):
        return None
    return [b for b in found if b is not None]


def _header_mentions(stmt: cst.BaseStatement, wanted: set[str]) -> bool:
    if isinstance(stmt, cst.If):
        tests: list[cst.CSTNode] = [stmt.test]
        orelse = stmt.orelse
        while isinstance(orelse, cst.If):
            tests.append(orelse.test)
            orelse = orelse.orelse
        return bool(names_in(tests) & wanted)
    if isinstance(stmt, cst.With):
        return bool(names_in(list(stmt.items)) & wanted)
    if isinstance(stmt, cst.Try):
        return bool(names_in([h.type for h in stmt.handlers if h.type is not None]) & wanted)
    return False


def _loading_units(
    ctx: FileContext, stmts: list[cst.BaseStatement], wanted: set[str], later: set[str]
) -> list[Unit] | None:
    """The statements to run on rank 0 alone so that only it loads the datasets: whole
    statements that do nothing but load, or, inside ``if``/``elif``/``else``, ``try`` and
    ``with`` blocks that also do other work (``class_labels = 10``), just their loading lines.
    None when loading cannot be separated (a line reads a dataset, or binds something else the
    code after it uses)."""
    units: list[Unit] = []
    for stmt in stmts:
        got = _classify(ctx, stmt, wanted, later)
        if got is None:
            return None
        units.extend(got)
    return units


def _classify(
    ctx: FileContext, stmt: cst.BaseStatement, wanted: set[str], later: set[str]
) -> list[Unit] | None:
    mentioned = names_in([stmt]) & wanted
    if not mentioned:
        return []  # unrelated: stays on every rank
    if isinstance(stmt, cst.SimpleStatementLine):
        bound = assigned_in([stmt])
        if not bound & wanted:
            if _is_print(ctx, stmt):
                return [(stmt, set())]  # says what was loaded: rank 0's, with the loading
            return None  # reads a dataset without loading it
        if (bound - wanted) & later:
            return None  # also defines something the code after it needs
        return [(stmt, bound & wanted)]
    blocks = _blocks_of(stmt)
    if blocks is None or _header_mentions(stmt, wanted):
        return None
    inner: list[Unit] = []
    whole = True
    rest: list[set[str]] = []  # each block's statements that stay on every rank, as code
    for block in blocks:
        got = _loading_units(ctx, block, wanted, later)
        if got is None:
            return None
        inner.extend(got)
        loading = {id(u[0]) for u in got}
        whole = whole and all(id(s) in loading for s in block)
        rest.append({ctx.code(s).strip() for s in block if id(s) not in loading})
    if isinstance(stmt, cst.Try) and not whole and not _same_outcome(stmt, rest):
        return None
    if whole and inner:
        return [(stmt, set().union(*(u[1] for u in inner)))]
    return inner


def _same_outcome(stmt: cst.Try, rest: list[set[str]]) -> bool:
    """Only rank 0 can fail to load, so only rank 0 may run an ``except`` (or skip ``else``).
    That is harmless when what stays on every rank in the handlers and the ``else`` also runs
    in the ``try`` body (``n_classes = 10`` on both paths). ``rest``: per block of the ``try``
    (body, handlers, else, finally, in that order), its statements kept on every rank."""
    body = rest[0]
    n_handlers = len(stmt.handlers) + (1 if stmt.orelse is not None else 0)
    return all(block <= body for block in rest[1 : 1 + n_handlers])


def _runs(ctx: FileContext, units: list[Unit]) -> list[list[Unit]]:
    """Units next to each other in one block share a guard (and one ``else``)."""
    runs: list[list[Unit]] = []
    for unit in units:
        if runs:
            prev = runs[-1][-1][0]
            block = ctx.facts.block_of.get(id(unit[0]))
            if block is not None and ctx.facts.block_of.get(id(prev)) is block:
                siblings = list(block.body)
                if siblings.index(unit[0]) == siblings.index(prev) + 1:
                    runs[-1].append(unit)
                    continue
        runs.append([unit])
    return runs


def _assigned_before(ctx: FileContext, name: str, stmt: cst.BaseStatement) -> bool:
    """Whether every path to ``stmt`` has assigned ``name``: an assignment at the top of a block
    that holds ``stmt`` (or one of its enclosing statements), earlier in that block, or a
    parameter of the enclosing function. Assignments nested in branches or loops do not count;
    a name this file never assigns counts as assigned."""
    mine = {id(a.stmt) for a in ctx.facts.assigns_of(name) if a.stmt is not None}
    if not mine:
        return True  # bound outside this file (a global of the caller's): nothing to misorder
    current: cst.BaseStatement | None = stmt
    while current is not None:
        block = ctx.facts.block_of.get(id(current))
        if block is not None:
            for earlier in block.body:
                if earlier is current:
                    break
                if id(earlier) in mine:
                    return True
        parent = ctx.facts.parent_statement(current)
        if isinstance(parent, cst.FunctionDef):
            params = parent.params
            every = [*params.posonly_params, *params.params, *params.kwonly_params]
            for extra in (params.star_arg, params.star_kwarg):
                if isinstance(extra, cst.Param):
                    every.append(extra)
            return any(p.name.value == name for p in every)
        current = parent
    return False


def _defining_statements(ctx: FileContext, item: _BlockWork, wanted: set[str]) -> list[int]:
    """Indices (in the iterator's block, before it) of statements assigning the datasets."""
    index = {id(stmt): i for i, stmt in enumerate(item.body)}
    found: set[int] = set()
    for name in wanted:
        for a in ctx.facts.assigns_of(name):
            if a.func is not item.func:
                continue
            stmt = a.stmt
            while stmt is not None and id(stmt) not in index:
                stmt = ctx.facts.parent_statement(stmt)
            if stmt is not None and index[id(stmt)] < item.first_iterator:
                found.add(index[id(stmt)])
    return sorted(found)


def _in_order(names_: list[str], body: list[cst.BaseStatement], defs: list[int]) -> list[str]:
    """Dataset names in the order the code first assigns them (train before test)."""
    order: dict[str, int] = {}
    for i in defs:
        stmt = body[i]
        code_order = _target_order(stmt)
        for pos, name in enumerate(code_order):
            order.setdefault(name, i * 1000 + pos)
    return sorted(names_, key=lambda d: (order.get(d, 10**9), d))


def _target_order(stmt: cst.BaseStatement) -> list[str]:
    """Names a statement assigns, in source order."""
    order: list[str] = []

    class _Ordered(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                order.extend(n for n in target_names(t.target) if n not in order)

    stmt.visit(_Ordered())
    return order


def _arg_value(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Arg)
        return node.with_changes(value=expression(value))

    return fn
