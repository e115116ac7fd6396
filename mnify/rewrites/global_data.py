"""``mnify convert --data global``: one global sample schedule instead of per-rank shards.

With ``--data scatter`` (the default) each rank trains on its shard, so a run is tied to its
world size. ``--data global`` defines the run by the schedule one process would follow
(docs/global_batch.md):

- the training set is not scattered: rank 0 loads it and every rank gets all of it
  (``train = mn.bcast_dataset(train, comm)``, the dataset step's broadcast, so a download or a
  draw from a per-rank random state happens once and every rank holds the same examples; numpy
  arrays are held once per host, shared read-only by its ranks, anything else is pickled); a
  ``TransformDataset`` (whose transform may not pickle) is built by every rank as written;
- Chainer's training iterator (``SerialIterator``, ``MultiprocessIterator``,
  ``MultithreadIterator``) becomes ``mn.create_global_batch_iterator(train, batch, comm)``, its
  ``repeat`` and ``shuffle`` carried over. ``batch`` is the **global** batch: the script's batch
  with ``--scaling strong``, the script's batch times ``comm.size`` with weak scaling. Loader
  workers (``n_processes``, ``n_threads``) become the global iterator's reading threads,
  ``n_threads=max(1, k // comm.intra_size)`` (the ranks of a node share its cores); what has
  no counterpart (``shared_mem``, ``n_prefetch``, ...) is dropped and reported;
- Chainer's ``extensions.snapshot(...)`` becomes ``mn.extensions.global_snapshot(...)`` with the
  same file name (and trigger, which stays on ``trainer.extend``): one file, written by rank 0,
  that ``chainer.serializers.load_npz(path, trainer)`` resumes on every rank at any number of
  ranks (the converter never guards such a load);
- evaluation iterators (``repeat=False``) keep the scatter: the multi-node evaluator averages
  over the shards as with ``--data scatter``, and an evaluator holds no state a resume needs.

What it buys: the same training at any number of ranks (a 2-rank run equals one process),
resuming at any number, and ``split="speed"`` for ranks of unequal speed. What it costs: every
rank holds a whole copy of the training set. ``--target chainermn`` has no global iterator:
nothing is changed there and the report says so.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import NodeFn, expression
from mnify.rewrites.iterators import dataset_name, is_training_iterator, iterator_calls
from mnify.rewrites.registry import rewrite

_STEP = "global-data"
_SIMPLE = (cst.Name, cst.Attribute, cst.Integer, cst.Subscript)

# the parameters of the iterators the global iterator replaces, in positional order
_PARAMETERS: dict[str, tuple[str, ...]] = {
    "SerialIterator": ("dataset", "batch_size", "repeat", "shuffle", "order_sampler"),
    "MultiprocessIterator": (
        "dataset",
        "batch_size",
        "repeat",
        "shuffle",
        "n_processes",
        "n_prefetch",
        "shared_mem",
        "order_sampler",
        "dataset_timeout",
        "maxtasksperchild",
    ),
    "MultithreadIterator": (
        "dataset",
        "batch_size",
        "repeat",
        "shuffle",
        "n_threads",
        "order_sampler",
    ),
}
# parameters that only tune loading: the global iterator reads in-process, so they go
_LOADING = frozenset(
    {"n_processes", "n_prefetch", "shared_mem", "dataset_timeout", "maxtasksperchild", "n_threads"}
)
# the worker counts, carried as the global iterator's reading threads
_WORKERS = ("n_processes", "n_threads")
_WIDTH = 99  # a longer call is written one argument a line
# Chainer's snapshot(savefun=None, filename=..., *, target=None, ...): what global_snapshot takes
_SNAPSHOT_PARAMETERS = ("savefun", "filename")
_SNAPSHOT_CARRIED = frozenset({"filename", "target"})


def bound_arguments(
    call: cst.Call, parameters: tuple[str, ...], *, any_keyword: bool = False
) -> dict[str, cst.Arg] | None:
    """The call's arguments by parameter name; None when they cannot be named (``*args``,
    ``**kwargs``, too many positionals, a keyword the signature lacks unless ``any_keyword``)."""
    bound: dict[str, cst.Arg] = {}
    position = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            if position >= len(parameters):
                return None
            bound[parameters[position]] = arg
            position += 1
        elif arg.keyword.value in parameters or any_keyword:
            bound[arg.keyword.value] = arg
        else:
            return None
    return bound


def iterator_parameters(qname: str) -> tuple[str, ...]:
    """The parameters of an iterator the step replaces, in positional order (empty: another)."""
    return _PARAMETERS.get(vocab.last(qname), ())


def _iterator_arguments(call: CallFact) -> dict[str, cst.Arg] | None:
    parameters = iterator_parameters(call.qname)
    if not parameters:
        return None
    bound = bound_arguments(call.node, parameters)
    if bound is None or "dataset" not in bound or "batch_size" not in bound:
        return None
    return bound


def replaces(ctx: FileContext, call: CallFact) -> bool:
    """``--data global`` turns this iterator into the global-batch iterator: a training iterator
    of Chainer's whose arguments carry over (no ``order_sampler``), where every rank runs it and
    sees the communicator. The dataset step hands its dataset whole to every rank instead of
    scattering it; the scaling and workers steps leave its batch and workers to this step."""
    if not ctx.options.global_data or ctx.spell.target != "mnify" or call.stmt is None:
        return False
    if not (vocab.is_iterator(call.qname) and is_training_iterator(call.node)):
        return False
    bound = _iterator_arguments(call)
    if bound is None or "order_sampler" in bound:
        return False
    if id(call.stmt) in ctx.facts.under_rank_test or not ctx.visible(call.func):
        return False
    return not ctx.suppressed(call.node, _STEP)


def broadcast(ctx: FileContext, name: str, comm: str) -> str:
    """How rank 0's whole dataset ``name`` reaches every rank: ``mn.bcast_dataset`` under
    ``--data global`` (numpy arrays held once per host, shared read-only; anything else
    pickled), ``comm.bcast_obj`` otherwise (a hand-evaluated test set, docs/converter.md MN805)."""
    if shares_arrays(ctx):
        return f"{ctx.runtime.top('bcast_dataset')}({name}, {comm})"
    return f"{comm}.bcast_obj({name})"


def shares_arrays(ctx: FileContext) -> bool:
    """Whole datasets go out through ``mn.bcast_dataset`` (``--data global``, mnify's runtime)."""
    return ctx.options.global_data and ctx.spell.target == "mnify"


def is_whole_broadcast(qname: str) -> bool:
    """``mn.bcast_dataset(...)``: a dataset already handed whole to every rank."""
    return vocab.is_runtime_name(qname, "bcast_dataset")


def built_here(ctx: FileContext, name: str) -> bool:
    """The training set ``name`` is a ``TransformDataset`` (its transform may hold a model or a
    closure that does not pickle): every rank builds it as the script does, nothing is sent."""
    for a in ctx.facts.assigns_of(name):
        fact = ctx.facts.call_of(a.value)
        if fact is not None and vocab.is_transform_dataset(fact.qname):
            return True
    return False


@rewrite(_STEP, order=34, code="MN818")
def plan(ctx: FileContext) -> None:
    if not ctx.options.global_data:
        return
    if ctx.spell.target != "mnify":
        if any(vocab.is_iterator(c.qname) for c in ctx.facts.calls):
            ctx.note(
                None,
                _STEP,
                "needs-person",
                "--data global needs mnify's runtime (ChainerMN has no global-batch iterator): "
                "the datasets are scattered as with --data scatter",
            )
        return
    replaced = 0
    for call in iterator_calls(ctx):
        if replaces(ctx, call):
            replaced += _plan_iterator(ctx, call)
        elif is_training_iterator(call.node) and not ctx.suppressed(call.node, _STEP):
            ctx.note(
                call.node,
                _STEP,
                "needs-person",
                f"--data global: {vocab.last(call.qname) or 'this iterator'} is not one mnify "
                "can turn into the global-batch iterator (a user or library iterator, an "
                "order_sampler, *args, or built under a rank check): its dataset keeps "
                "scatter_dataset, so this run stays tied to its number of ranks",
            )
    if not replaced:
        return
    _plan_snapshots(ctx)
    _note_resumes(ctx)


def _plan_iterator(ctx: FileContext, call: CallFact) -> int:
    bound = _iterator_arguments(call)
    assert bound is not None and call.stmt is not None
    comm = ctx.comm_at(call.func, "global-batch iterator")
    if comm is None:
        return 0
    batch_value = bound["batch_size"].value
    code = ctx.code(batch_value)
    operand = code if isinstance(batch_value, _SIMPLE) else f"({code})"
    if ctx.options.scaling == "strong":
        global_batch, per_rank = code, f"{operand} / {comm}.size"
        meaning = "the script's batch is the global batch (--scaling strong)"
    else:
        global_batch, per_rank = f"{operand} * {comm}.size", code
        meaning = (
            f"weak scaling: the global batch is the script's batch times {comm}.size, so each "
            f"rank still computes about {code} examples a step"
        )
    name = dataset_name(call.node)
    if name is not None and built_here(ctx, name):
        ctx.note(
            call.node,
            _STEP,
            "info",
            f"{name} is a TransformDataset: every rank builds it as the script does (its "
            "transform may not pickle), so what it is built from must be the same on every rank "
            "(the iterator checks the lengths)",
        )
    factory = ctx.runtime.top("create_global_batch_iterator")
    # shuffle=None is Chainer's default (shuffle): the global iterator's default too
    carried: list[str] = [
        name for name in ("repeat", "shuffle") if name in bound and not _is_none(bound[name].value)
    ]
    workers = _workers(ctx, bound, comm)
    extra = [f"n_threads={workers}"] if workers is not None else []
    ctx.plan.replace_node(
        call.node,
        _global_iterator(
            call.qname, factory, global_batch, comm, carried, extra, _line_start(ctx, call)
        ),
        call.stmt,
    )
    ctx.note(
        call.node,
        _STEP,
        "changed",
        f"{vocab.last(call.qname)} -> {factory}: global batch {global_batch}; {meaning}. Every "
        "rank reads its contiguous part of each global batch of one seeded schedule (seed 0), "
        "so any number of ranks trains like one process with that batch",
        facts=(("per_rank_batch", per_rank), ("global_batch", global_batch)),
    )
    if workers is not None:
        ctx.note(
            call.node,
            _STEP,
            "info",
            f"{vocab.last(call.qname)}'s workers become n_threads={workers}: threads of the "
            "training process read this rank's examples of each step (the ranks of a node share "
            "its cores)",
        )
    dropped = sorted(n for n in bound if n in _LOADING and (workers is None or n not in _WORKERS))
    if dropped or (vocab.is_multiprocess_iterator(call.qname) and workers is None):
        ctx.note(
            call.node,
            _STEP,
            "info",
            f"{vocab.last(call.qname)}'s {', '.join(dropped) or 'default workers'} not carried: "
            "the global-batch iterator reads this rank's part of each step in the training "
            "process (n_threads threads at most, no prefetch); keep loading cheap per example",
        )
    ctx.note(
        call.node,
        _STEP,
        "info",
        "--data global buys the same training at any number of ranks, resuming a global "
        "snapshot at any number, and split='speed' for ranks of unequal speed; it costs a whole "
        "copy of the training set on every rank",
    )
    return 1


def _workers(ctx: FileContext, bound: dict[str, cst.Arg], comm: str) -> str | None:
    """The global iterator's ``n_threads`` for the loader workers the script asked for
    (``n_processes`` or ``n_threads``), divided among the ranks of a node as the workers step
    divides them; None where none was given (Chainer's default)."""
    given = next((bound[n].value for n in _WORKERS if n in bound), None)
    if given is None or _is_none(given):
        return None
    code = ctx.code(given)
    operand = code if isinstance(given, _SIMPLE) else f"({code})"
    return f"max(1, {operand} // {comm}.intra_size)"


def _line_start(ctx: FileContext, call: CallFact) -> tuple[int, int]:
    """The indent of the statement's line as written and the columns of ``name = `` before the
    iterator call when the call is what the statement assigns."""
    assert call.stmt is not None
    line = ctx.source.splitlines()[ctx.line(call.stmt) - 1]
    indent = len(line) - len(line.lstrip())
    prefix = 0
    for a in ctx.facts.assigns:
        if a.value is call.node and a.stmt is call.stmt and len(a.targets) == 1:
            prefix = len(a.targets[0]) + 3
    return indent, prefix


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _global_iterator(
    qname: str,
    factory: str,
    batch: str,
    comm: str,
    carried: list[str],
    extra: list[str],
    start: tuple[int, int],
) -> NodeFn:
    """``SerialIterator(train, b, repeat=..., shuffle=...)`` -> ``factory(train, B, comm, ...)``
    from the updated call (its dataset argument as the other steps left it)."""

    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        bound = bound_arguments(node, _PARAMETERS[vocab.last(qname)])
        assert bound is not None
        empty = cst.Module([])
        parts = [empty.code_for_node(bound["dataset"].value), batch, comm]
        parts += [f"{name}={empty.code_for_node(bound[name].value)}" for name in carried]
        parts += extra
        code = f"{factory}({', '.join(parts)})"
        indent, prefix = start
        if indent + prefix + len(code) > _WIDTH:  # one argument a line, as black would
            # (libcst indents continuation lines by the enclosing block's indentation)
            code = f"{factory}(\n" + "".join(f"    {p},\n" for p in parts) + ")"
        return expression(code).with_changes(lpar=node.lpar, rpar=node.rpar)

    return fn


# ---------------------------------------------------------------------------------- snapshots
def _plan_snapshots(ctx: FileContext) -> None:
    """``extensions.snapshot(filename=...)`` -> ``mn.extensions.global_snapshot(filename=...)``."""
    for call in ctx.facts.calls:
        if not vocab.is_extension(call.qname, "snapshot") or call.stmt is None:
            continue
        if ctx.suppressed(call.node, _STEP):
            continue
        bound = bound_arguments(call.node, _SNAPSHOT_PARAMETERS, any_keyword=True)
        other = sorted(set(bound or {}) - _SNAPSHOT_CARRIED) if bound is not None else ["*args"]
        if other:
            ctx.note(
                call.node,
                _STEP,
                "needs-person",
                f"this snapshot has {', '.join(other)}, which global_snapshot does not take: it "
                "stays a per-rank snapshot, which resumes only at the number of ranks that wrote "
                "it; write mn.extensions.global_snapshot(filename=...) to resume at any number",
            )
            continue
        assert bound is not None
        name = ctx.runtime.top("extensions.global_snapshot")
        parts = [
            f"{key}={ctx.code(bound[key].value)}" for key in ("filename", "target") if key in bound
        ]
        value = f"{name}({', '.join(parts)})"
        ctx.plan.replace_node(call.node, _replaced_by(value), call.stmt)
        ctx.note(
            call.node,
            _STEP,
            "changed",
            f"snapshot -> {name}: one file on rank 0 with the model, the optimizer and the "
            "global iterator's schedule, resumable at any number of ranks (same file name and "
            "trigger)",
        )


def _replaced_by(value: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Call)
        return expression(value).with_changes(lpar=node.lpar, rpar=node.rpar)

    return fn


def _note_resumes(ctx: FileContext) -> None:
    """``chainer.serializers.load_npz(args.resume, trainer)`` stays on every rank: say what it
    now does (a global snapshot resumes at any number of ranks)."""
    trainers = {t for a in ctx.facts.assigns for t in a.targets if _is_trainer_value(ctx, a.value)}
    for call in ctx.facts.calls:
        if vocab.last(call.qname) != "load_npz" or not vocab.under(call.qname, "chainer"):
            continue
        args = [a for a in call.node.args if a.keyword is None]
        if len(args) < 2 or not isinstance(args[1].value, cst.Name):
            continue
        if args[1].value.value not in trainers or call.stmt is None:
            continue
        if id(call.stmt) in ctx.facts.under_rank_test or ctx.under_rank0_guard(call.stmt):
            continue
        ctx.note(
            call.node,
            _STEP,
            "info",
            "resuming stays on every rank: a global snapshot loads at any number of ranks and "
            "goes on with exactly the examples of the epoch not yet seen",
        )


def _is_trainer_value(ctx: FileContext, value: cst.BaseExpression | None) -> bool:
    fact = ctx.facts.call_of(value)
    return fact is not None and vocab.is_trainer(fact.qname)
