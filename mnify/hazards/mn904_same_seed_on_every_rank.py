"""MN904 ``same-seed-on-every-rank``: a data-parallel script seeds the global random generator
with the same value on every rank.

Its documentation (docs/rules.md, ``mnify explain MN904``) is generated from the rule class below.
The fix is here too: :func:`fix`, the converter step ``seeds`` (MN817, docs/converter.md). It
keeps the seed where the script sets it, so what is built before training stays the same on
every rank (initial weights, a fixed split, a fixed noise sample), and seeds again with the rank
added right before training starts, so what each rank draws while training differs. Fixture:
fixtures/lint/MN904.py.

Family: MN9xx: information and preview rules, off by default (select them explicitly). A preview
rule, like ruff's: it can be promoted to a default family once it has run over real scripts.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mnify import vocabulary as vocab
from mnify.hazards.rule import AppliesTo, Rule
from mnify.program.context import LintContext
from mnify.program.facts import CallFact
from mnify.rewrites.batch_sources import (
    StepFunction,
    calls_function,
    is_optimizer_step,
    optimizer_names,
)
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import statement
from mnify.rewrites.registry import rewrite
from mnify.syntax import argument, argument_node, assigned_in, calls_in, mentions_rank, names_in

# what seeds a process-wide random generator (qualified names, as lint resolves callees)
GLOBAL_SEEDERS = frozenset({"numpy.random.seed", "random.seed", "cupy.random.seed"})
_RANK_KINDS = ("global", "intra", "inter")


class SameSeedOnEveryRank(Rule):
    """Fires, in a data-parallel script, on each call of ``numpy.random.seed``, ``random.seed``
    or ``cupy.random.seed`` that runs on every rank (not inside a rank-conditional ``if``, not
    after a rank-conditional early exit) with a seed that does not use the rank (``comm.rank``,
    ``comm.intra_rank``, a name bound to one, an MPI rank variable), unless the same generator
    is seeded with the rank later in the same function (or, for a module-level call, anywhere
    later): then the common seed only makes what is built before that alike on every rank. A
    call without a seed is left alone: it seeds from the operating system, differently on each
    rank."""

    code = "MN904"
    name = "same-seed-on-every-rank"
    summary = (
        "the global random generator gets the same seed on every rank: their random draws repeat"
    )
    why = (
        "Each rank then draws the same random numbers: dropout masks, data augmentation and any "
        "input the script samples itself (a GAN's noise, negative samples) repeat across ranks, "
        "so N ranks train on N copies of one random batch instead of N batches and the run is "
        "not the one-process run with an N times larger batch. `mnify run --verify` reports it "
        "as same-data when it reaches the gradients. Parameters need no common seed: the "
        "multi-node optimizer broadcasts rank 0's at setup. Keep the common seed for what is "
        "built before training and seed again with the rank added right before it starts."
    )
    bad = (
        "import numpy as np\n\n"
        "comm = chainermn.create_communicator()\n"
        "np.random.seed(args.seed)\n"
        "model = L.Classifier(Generator())\n"
        "optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)\n"
        "optimizer.setup(model)\n"
        "for x in batches:\n"
        "    optimizer.update(model, x, np.random.normal(size=(len(x), 128)))\n"
    )
    good = (
        "import numpy as np\n\n"
        "comm = chainermn.create_communicator()\n"
        "np.random.seed(args.seed)\n"
        "model = L.Classifier(Generator())\n"
        "optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)\n"
        "optimizer.setup(model)\n"
        "np.random.seed(args.seed + comm.rank)\n"
        "for x in batches:\n"
        "    optimizer.update(model, x, np.random.normal(size=(len(x), 128)))\n"
    )
    default_enabled = False
    fixable = True
    applies_to = AppliesTo.DATA_PARALLEL

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        # (call, generators, scope) in source order: same seed everywhere / seeded by rank
        self._alike: list[tuple[cst.Call, frozenset[str], cst.CSTNode]] = []
        self._by_rank: list[tuple[int, frozenset[str], cst.CSTNode]] = []

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        seeds = ctx.callee_names(node) & GLOBAL_SEEDERS
        if not node.args or not seeds or ctx.on_some_ranks():
            return
        if any(ctx.find_rank(arg.value, _RANK_KINDS) is not None for arg in node.args):
            self._by_rank.append((len(self._alike), seeds, ctx.scope_node))
            return
        self._alike.append((node, seeds, ctx.scope_node))

    def finish(self) -> None:
        for index, (node, seeds, scope) in enumerate(self._alike):
            module = isinstance(scope, cst.Module)
            if not any(
                later > index and seeds & others and (module or where is scope)
                for later, others, where in self._by_rank
            ):
                self.report(node)


# ------------------------------------------------------------------------------------ fix
FIX_DOC = """Seeds (issue 31, item 5): what each rank draws while training differs; what is built before
training stays alike.

A global seed the script sets alike on every rank (``np.random.seed(1234)``, ``random.seed``,
``cupy.random.seed``, or a helper of the file that calls them with its parameter:
``set_random_seed(args.seed)``) is kept where it is: initial weights (which the multi-node
optimizer broadcasts from rank 0 anyway), a split made with the global generator, a fixed noise
sample drawn before training are then the same on every rank. Right before training starts (the
first statement after the seed, in the same block, that runs a Trainer, steps an optimizer or
calls what does), after the model and optimizer are set up, the same generator is seeded again
with the rank added::

    np.random.seed(1234 + comm.rank)

so noise, dropout masks and augmentation drawn during training differ between ranks (N ranks
then draw what one process draws for an N times larger batch). Where training's start cannot be
told from the seed's place (the seed set under a branch or in a loop, training not found after
it, a seed expression that may change in between, the communicator out of reach) the seed is
listed under "Needs a person" with its line.
"""

_STEP = "seeds"


@dataclass(frozen=True)
class _Seed:
    """One seeding of a global generator: the call, its seed expression, and how to seed the
    same generator again with another value (the call's code with ``{}`` for the seed)."""

    call: CallFact
    seed: cst.BaseExpression
    again: str


@rewrite(_STEP, order=85, fixes=("MN904",), code="MN817", doc=FIX_DOC)
def fix(ctx: FileContext) -> None:
    if not ctx.options.data_parallel:
        return
    trainers = _training_functions(ctx)
    planned: dict[int, list[str]] = {}  # training statement -> reseeds before it
    anchors: dict[int, cst.BaseStatement] = {}
    for seed in _seeds(ctx):
        call = seed.call
        assert call.stmt is not None
        if ctx.suppressed(call.node, _STEP) or id(call.stmt) in ctx.facts.under_rank_test:
            continue
        if any(ctx.facts.call_of(n) is not None for n in calls_in(seed.seed)):
            continue  # a seed computed by a call (the clock): not alike on every rank
        where = _training_start(ctx, call.stmt, trainers)
        shown = ctx.code(call.node)
        if where is None:
            if _trains_after(ctx, call.stmt, trainers):
                _cannot_tell(ctx, call, shown, "where training starts after it was not found")
            continue
        if _reseeded_by_rank(ctx, call, where):
            continue  # converted before: the same generator is seeded with the rank already
        comm = ctx.comm_at(ctx.facts.block_of[id(where)].func, _STEP)
        if comm is None or ctx.before_comm_exists(where):
            _cannot_tell(ctx, call, shown, "the communicator is not in scope where training starts")
            continue
        changed = _rebound_between(ctx, seed.seed, call.stmt, where)
        if changed:
            _cannot_tell(ctx, call, shown, f"{changed} may change before training starts")
            continue
        value = ctx.code(seed.seed)
        if not isinstance(seed.seed, (cst.Name, cst.Attribute, cst.Integer, cst.Subscript)):
            value = f"({value})"
        again = seed.again.format(f"{value} + {comm}.rank")
        planned.setdefault(id(where), []).append(again)
        anchors[id(where)] = where
        said = (
            f"{shown} seeds alike on every rank: kept for what is built before training (initial "
            f"weights, splits, fixed samples), and `{again}` seeds it per rank right before "
            f"training (line {ctx.line(where)}), so noise, dropout masks and augmentation differ "
            "between ranks"
        )
        if ctx.options.global_data:
            said += (
                "; with --data global this makes runs at different numbers of ranks differ "
                "wherever training draws from it (the global schedule itself has its own seed)"
            )
        ctx.note(call.node, _STEP, "changed", said)
    for key, lines in planned.items():
        ctx.plan.insert_before(anchors[key], [statement(f"{line}\n") for line in lines])


def _reseeded_by_rank(ctx: FileContext, call: CallFact, where: cst.BaseStatement) -> bool:
    """The statements right before the training start seed ``call``'s generator with the rank."""
    block = ctx.facts.block_of.get(id(where))
    if block is None:
        return False
    body = list(block.body)
    before = body[: body.index(where)]
    return any(
        c.qname == call.qname and mentions_rank(c.node)
        for stmt in before
        for c in ctx.facts.calls_by_stmt.get(id(stmt), [])
    )


def _cannot_tell(ctx: FileContext, call: CallFact, shown: str, why: str) -> None:
    ctx.note(
        call.node,
        _STEP,
        "needs-person",
        f"{shown} seeds alike on every rank, and {why}: seed again with the rank added "
        "(seed + comm.rank) where training starts, after the model and optimizer are set up",
    )


def _seeds(ctx: FileContext) -> list[_Seed]:
    """Calls that seed a global generator with a seed that does not use the rank: the
    generator's own ``seed(...)``, or a function of the file whose calls are all seedings
    with one of its parameters (``def set_random_seed(seed): random.seed(seed); ...``)."""
    helpers = _seeding_helpers(ctx)
    found: list[_Seed] = []
    for call in ctx.facts.calls:
        if call.stmt is None or call.func is not None and id(call.func) in helpers.values():
            continue
        if call.qname in GLOBAL_SEEDERS:
            param: str | None = "seed"
            position = 0
        elif call.qname.lstrip(".") in helpers:
            helper = ctx.facts.module_functions[call.qname.lstrip(".")]
            param = _seed_parameter(ctx, helper)
            params = [p.name.value for p in helper.params.params]
            position = params.index(param) if param in params else -1
        else:
            continue
        given = argument_node(call.node, position, param or "seed")
        if given is None or mentions_rank(given.value):
            continue
        if any(a.star for a in call.node.args):
            continue
        parts = []
        for arg in call.node.args:
            if arg is given:
                parts.append(f"{arg.keyword.value}={{}}" if arg.keyword is not None else "{}")
            else:
                parts.append(
                    ctx.code(arg).strip().rstrip(",").replace("{", "{{").replace("}", "}}")
                )
        func = ctx.code(call.node.func).replace("{", "{{").replace("}", "}}")
        found.append(_Seed(call, given.value, f"{func}({', '.join(parts)})"))
    return found


def _seeding_helpers(ctx: FileContext) -> dict[str, int]:
    """Module-level functions of the file that only seed global generators (every call in
    them is a seeding, one of them with a parameter): name -> id of the function."""
    found: dict[str, int] = {}
    for name, func in ctx.facts.module_functions.items():
        if _seed_parameter(ctx, func) is not None:
            found[name] = id(func)
    return found


def _seed_parameter(ctx: FileContext, func: cst.FunctionDef) -> str | None:
    """The parameter a seeding-only function seeds with, if it is one."""
    mine = [c for c in ctx.facts.calls if c.func is func]
    if not mine or not all(c.qname in GLOBAL_SEEDERS for c in mine):
        return None
    params = [p.name.value for p in func.params.params]
    for c in mine:
        seed = argument(c.node, 0, "seed")
        if isinstance(seed, cst.Name) and seed.value in params:
            return seed.value
    return None


def _training_functions(ctx: FileContext) -> set[int]:
    """Functions of the file that train (run a Trainer, step an optimizer), directly or through
    another function of the file. A local query: mnify/program/effects.py answers it across the
    project and installed packages, and should replace it once it is the project's."""
    optimizers = optimizer_names(ctx)
    found = {
        id(c.func) for c in ctx.facts.calls if c.func is not None and _trains(ctx, c, optimizers)
    }
    changed = True
    while changed:
        changed = False
        for c in ctx.facts.calls:
            if c.func is None or id(c.func) in found:
                continue
            callee = _callee(ctx, c)
            if callee is not None and id(callee) in found:
                found.add(id(c.func))
                changed = True
    return found


def _callee(ctx: FileContext, call: CallFact) -> cst.FunctionDef | None:
    """The function of the file a call runs: a module function by name, a method through
    ``self`` or an instance the calling function makes of the file's class."""
    func = ctx.facts.module_functions.get(call.qname.lstrip("."))
    if func is not None:
        return func
    if call.method is None:
        return None
    for cls in ctx.facts.classes.values():
        for stmt in cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == call.method:
                if calls_function(ctx, call, StepFunction(stmt, cls)):
                    return stmt
    return None


def _trains(ctx: FileContext, call: CallFact, optimizers: set[str]) -> bool:
    """``trainer.run()`` of a Trainer the file builds, or an optimizer step."""
    if is_optimizer_step(call, optimizers):
        return True
    if call.method != "run" or call.receiver is None:
        return False
    made = [ctx.facts.call_of(a.value) for a in ctx.facts.assigns_of(call.receiver)]
    return any(m is not None and vocab.is_trainer(m.qname) for m in made)


def _statement_trains(ctx: FileContext, stmt: cst.BaseStatement, trainers: set[int]) -> bool:
    optimizers = optimizer_names(ctx)
    for c in ctx.facts.calls:
        if c.stmt is None or not ctx.facts.within(c.stmt, stmt):
            continue
        if _trains(ctx, c, optimizers):
            return True
        callee = _callee(ctx, c)
        if callee is not None and id(callee) in trainers:
            return True
    return False


def _training_start(
    ctx: FileContext, seeded: cst.BaseStatement, trainers: set[int]
) -> cst.BaseStatement | None:
    """The first statement after ``seeded``, in its block, that trains; for a seed set at
    module level, also the first that trains in the entry point's body. None: the seed is not
    a statement of a function's (or the module's) own body, or nothing after it trains."""
    parent = ctx.facts.parent_statement(seeded)
    if parent is not None and not isinstance(parent, cst.FunctionDef) and not _main_guard(parent):
        return None  # under a branch, a loop, a with or a try: not every run seeds here
    block = ctx.facts.block_of.get(id(seeded))
    if block is None:
        return None
    body = list(block.body)
    for stmt in body[body.index(seeded) + 1 :]:
        if _statement_trains(ctx, stmt, trainers):
            return stmt
    entry = ctx.entry
    if parent is None and entry is not None and entry.func is not None:
        inner = entry.func.body
        for stmt in inner.body if isinstance(inner, cst.IndentedBlock) else []:
            if _statement_trains(ctx, stmt, trainers):
                return stmt if isinstance(stmt, cst.BaseStatement) else None
    return None


def _main_guard(stmt: cst.BaseStatement) -> bool:
    """``if __name__ == '__main__':`` (every run of the script takes it)."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None:
        return False
    code = cst.Module([]).code_for_node(stmt.test).replace("'", '"')
    return "__name__" in code and '"__main__"' in code


def _trains_after(ctx: FileContext, seeded: cst.BaseStatement, trainers: set[int]) -> bool:
    """Whether the seed's function trains at all (then where training starts matters)."""
    block = ctx.facts.block_of.get(id(seeded))
    func = block.func if block is not None else None
    if func is not None:
        return id(func) in trainers or any(
            _statement_trains(ctx, s, trainers)
            for s in (func.body.body if isinstance(func.body, cst.IndentedBlock) else [])
        )
    return any(_statement_trains(ctx, s, trainers) for s in ctx.module.body)


def _rebound_between(
    ctx: FileContext, seed: cst.BaseExpression, seeded: cst.BaseStatement, where: cst.BaseStatement
) -> str | None:
    """A name of the seed expression assigned between the seeding and the training start (the
    seed then might not be what the script seeded with), or, for a module-level seed reseeded
    in a function, assigned in that function."""
    names = names_in([seed])
    block = ctx.facts.block_of.get(id(where))
    if block is None:
        return None
    body = list(block.body)
    if ctx.facts.block_of.get(id(seeded)) is block:
        between = body[body.index(seeded) + 1 : body.index(where)]
        hit = sorted(assigned_in(between) & names)
        return hit[0] if hit else None
    hit = sorted(n for n in names if any(a.func is block.func for a in ctx.facts.assigns_of(n)))
    return hit[0] if hit else None
