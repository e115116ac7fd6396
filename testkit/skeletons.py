"""Hypothesis strategies that write realistic Chainer 7 training scripts for the converter.

The scripts follow the shapes of Chainer's own examples (argparse with ``--gpu``/``--device``,
``--batchsize``, ``--epoch``, ``--out``; ``get_mnist``/``get_cifar10`` or a user helper;
Serial/Multiprocess iterators; an optimizer; a Trainer with its extensions or a hand-written
loop). What varies is what the converter finds hard: prints, ``save_npz``, ``open(..., 'w')``
writes, extension registrations, dataset loads and (in already-distributed scripts) collectives,
placed next to the user's own ``if``/``for``/``while``/``try``/``with`` blocks, nested up to
three deep, as siblings in any order, before, inside and after the training loop, in helper
functions (called before argument parsing, from the loop, after training; one evaluates and
prints), at module level with or without a ``__main__`` guard; datasets are loaded flat or,
with their iterators, inside ``if``/``else``, ``try``/``except`` and ``with`` blocks.

Statements are built as a tiny tree (:class:`Line`, :class:`Block`) and rendered with four-space
indentation, so every generated script is valid Python by construction; that it reads no
undefined name is ``test_generated_scripts_are_sensible_programs``'s check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st

MAX_DEPTH = 3  # deepest nesting of user blocks the grammar produces


@dataclass(frozen=True)
class Line:
    """One simple statement (a single physical line, no indentation)."""

    text: str


@dataclass(frozen=True)
class Block:
    """A compound statement: ``header:`` with a body, then clauses (``else:``, ``except ...:``)."""

    header: str
    body: tuple[Stmt, ...]
    clauses: tuple[tuple[str, tuple[Stmt, ...]], ...] = ()


Stmt = Line | Block


def render(stmts: Sequence[Stmt], indent: int = 0) -> list[str]:
    """Source lines for ``stmts`` at ``indent`` levels of four spaces."""
    pad = "    " * indent
    out: list[str] = []
    for stmt in stmts:
        if isinstance(stmt, Line):
            out.append(pad + stmt.text)
            continue
        out.append(f"{pad}{stmt.header}:")
        out.extend(render(stmt.body, indent + 1))
        for clause, body in stmt.clauses:
            out.append(f"{pad}{clause}:")
            out.extend(render(body, indent + 1))
    return out


@dataclass(frozen=True)
class Names:
    """The variable names one script uses (they vary between scripts)."""

    args: str = "args"
    model: str = "model"
    model_class: str = "MLP"
    optimizer: str = "optimizer"
    train: str = "train"
    test: str = "test"
    train_iter: str = "train_iter"
    test_iter: str = "test_iter"
    trainer: str = "trainer"
    iteration: str = "iteration"
    evaluator: str = "evaluator"
    comm: str = "comm"
    mn: str = "chainermn"  # how a distributed script spells its ChainerMN module


@dataclass(frozen=True)
class Scope:
    """Where a generated block sits: which names it may use and which statements fit there."""

    names: Names
    trainer: bool = False  # a Trainer exists: extension registrations fit
    loop: bool = False  # inside the training loop: the iteration counter and is_new_epoch
    data: bool = False  # the datasets are loaded
    model: bool = False  # the model and the optimizer exist
    evaluator: bool = False  # an Evaluator object exists (custom loops)
    eval_helper: bool = False  # the user's evaluate(model, it) helper exists
    report_helper: bool = False  # report(evaluator, epoch): evaluates, then prints
    distributed: bool = False  # the script already creates a communicator
    loop_vars: tuple[str, ...] = field(default=())  # variables of enclosing user for-loops


# ---------------------------------------------------------------------------- leaf statements

_FILE_NAMES = ("model.npz", "final.npz", "mlp.model", "net_final.npz", "weights.npz")
_STATE_FILES = ("optimizer.npz", "mlp.state", "opt_state.npz")


def _path(names: Names, fname: str, style: int) -> str:
    a = names.args
    if style == 0:
        return f"os.path.join({a}.out, '{fname}')"
    if style == 1:
        return f"'{{}}/{fname}'.format({a}.out)"
    return f"{a}.out + '/{fname}'"


@st.composite
def prints(draw: st.DrawFn, scope: Scope) -> list[Stmt]:
    """An informational print of the kind rank 0 alone should run."""
    n = scope.names
    options = [
        f"print('# Minibatch-size: {{}}'.format({n.args}.batchsize))",
        f"print('# epoch: {{}}'.format({n.args}.epoch))",
        f"print('output directory:', {n.args}.out)",
        "print('')",
        "print('-' * 40)",
        f"print(f'batch size {{{n.args}.batchsize}}')",
    ]
    if scope.data:
        options.append(f"print('train size:', len({n.train}), 'test size:', len({n.test}))")
    if scope.loop:
        options += [
            f"print('iteration', {n.iteration})",
            f"print('epoch: {{}}'.format({n.train_iter}.epoch))",
            f"print('iter {{}} epoch {{}}'.format({n.iteration}, {n.train_iter}.epoch))",
        ]
    if scope.loop_vars:
        options.append(f"print('step', {scope.loop_vars[-1]})")
    return [Line(draw(st.sampled_from(options)))]


@st.composite
def saves(draw: st.DrawFn, scope: Scope) -> list[Stmt]:
    """``serializers.save_npz`` of the model or the optimizer (rank 0's job)."""
    n = scope.names
    style = draw(st.integers(0, 2))
    module = draw(st.sampled_from(["serializers", "chainer.serializers"]))
    if draw(st.booleans()):
        path = _path(n, draw(st.sampled_from(_FILE_NAMES)), style)
        return [Line(f"{module}.save_npz({path}, {n.model})")]
    path = _path(n, draw(st.sampled_from(_STATE_FILES)), style)
    return [Line(f"{module}.save_npz({path}, {n.optimizer})")]


@st.composite
def file_writes(draw: st.DrawFn, scope: Scope) -> list[Stmt]:
    """``open(path, 'w')`` writes: a ``with`` block, a one-liner, or ``np.save``."""
    n = scope.names
    style = draw(st.integers(0, 2))
    kind = draw(st.integers(0, 3))
    handle = draw(st.sampled_from(["f", "fp", "out_file"]))
    if kind == 0:
        path = _path(n, "args.json", style)
        body = (Line(f"json.dump(vars({n.args}), {handle})"),)
        return [Block(f"with open({path}, 'w') as {handle}", body)]
    if kind == 1:
        path = _path(n, "log.txt", style)
        text = f"'epoch {{}}\\n'.format({n.train_iter}.epoch)" if scope.loop else "'done\\n'"
        mode = draw(st.sampled_from(["'w'", "'a'"]))
        return [Block(f"with open({path}, {mode}) as {handle}", (Line(f"{handle}.write({text})"),))]
    if kind == 2:
        path = _path(n, "finished", style)
        return [Line(f"open({path}, 'w').write('ok')")]
    path = _path(n, "curve.npy", style)
    return [Line(f"np.save({path}, np.zeros(3))")]


_WRITER_EXTENSIONS = (
    "extensions.LogReport()",
    "extensions.PrintReport(['epoch', 'main/loss', 'validation/main/loss', 'elapsed_time'])",
    "extensions.ProgressBar()",
    "extensions.snapshot(filename='snapshot_epoch_{.updater.epoch}')",
    "extensions.snapshot_object({model}, 'model_epoch_{.updater.epoch}')",
    "extensions.DumpGraph('main/loss')",
)
_STATE_EXTENSIONS = (
    "extensions.ExponentialShift('alpha', 0.5)",
    "extensions.observe_lr()",
)


@st.composite
def registrations(draw: st.DrawFn, scope: Scope) -> list[Stmt]:
    """A ``trainer.extend(...)``: writers (rank 0 only) and state changers (every rank)."""
    n = scope.names
    ext = draw(st.sampled_from(_WRITER_EXTENSIONS + _STATE_EXTENSIONS)).replace("{model}", n.model)
    trigger = draw(st.sampled_from(["", ", trigger=(1, 'epoch')", ", trigger=(100, 'iteration')"]))
    if "ProgressBar" in ext or "observe_lr" in ext:
        trigger = ""
    return [Line(f"{n.trainer}.extend({ext}{trigger})")]


@st.composite
def plot_reports(draw: st.DrawFn, scope: Scope) -> list[Stmt]:
    """PlotReport under ``if extensions.PlotReport.available():`` as Chainer's examples do."""
    n = scope.names
    test = draw(
        st.sampled_from(
            [
                "extensions.PlotReport.available()",
                f"{n.args}.plot and extensions.PlotReport.available()",
            ]
        )
    )
    body = [
        Line(
            f"{n.trainer}.extend(extensions.PlotReport(['main/loss', 'validation/main/loss'], "
            "'epoch', file_name='loss.png'))"
        )
    ]
    if draw(st.booleans()):
        body.append(
            Line(
                f"{n.trainer}.extend(extensions.PlotReport(['main/accuracy', "
                "'validation/main/accuracy'], 'epoch', file_name='accuracy.png'))"
            )
        )
    return [Block(f"if {test}", tuple(body))]


@st.composite
def collectives(draw: st.DrawFn, scope: Scope) -> list[Stmt]:
    """Collectives of an already-distributed script: every rank must keep reaching them."""
    n = scope.names
    c = n.comm
    options = [
        f"total = {c}.allreduce_obj(1.0)",
        f"settings = {c}.bcast_obj(vars({n.args}))",
        f"print('mean', {c}.allreduce_obj(1.0) / {c}.size)",
        f"{c}.barrier()",
    ]
    if scope.loop:
        options.append(f"seen = {c}.allreduce_obj({n.iteration})")
    return [Line(draw(st.sampled_from(options)))]


@st.composite
def evaluations(draw: st.DrawFn, scope: Scope) -> list[Stmt]:
    """Running the evaluation inside a custom loop (a collective once converted)."""
    n = scope.names
    options = []
    if scope.evaluator:
        options += [f"result = {n.evaluator}()", f"{n.evaluator}.evaluate()"]
    if scope.eval_helper:
        options.append(f"evaluate({n.model}, {n.test_iter})")
    if scope.report_helper and scope.evaluator:
        options.append(f"report({n.evaluator}, {n.train_iter}.epoch)")
    return [Line(draw(st.sampled_from(options)))]


@st.composite
def computations(draw: st.DrawFn, scope: Scope) -> list[Stmt]:
    """Plain bookkeeping that is neither a write nor a collective."""
    n = scope.names
    options = [
        "stamp = time.time()",
        f"note = 'batch {{}}'.format({n.args}.batchsize)",
        f"n_units = getattr({n.args}, 'unit', 100)",
    ]
    if scope.data:
        options.append(f"n_train = len({n.train})")
    if scope.loop:
        options.append(f"last_epoch = {n.train_iter}.epoch")
    return [Line(draw(st.sampled_from(options)))]


def leaves(scope: Scope) -> st.SearchStrategy[list[Stmt]]:
    """Every leaf that fits ``scope``; writers weigh most (they are what gets guarded)."""
    options = [prints(scope), prints(scope), file_writes(scope), computations(scope)]
    if scope.model:
        options += [saves(scope), saves(scope)]
    if scope.trainer and not scope.loop:
        options += [registrations(scope), registrations(scope), plot_reports(scope)]
    if scope.distributed:
        options.append(collectives(scope))
    if scope.loop and (scope.evaluator or scope.eval_helper):
        options.append(evaluations(scope))
    return st.one_of(options)


# ------------------------------------------------------------------------- user blocks


def _conditions(scope: Scope) -> list[str]:
    n = scope.names
    options = [
        f"{n.args}.verbose",
        f"{n.args}.resume",
        f"os.path.isdir({n.args}.out)",
        f"{n.args}.epoch > 1",
        f"not {n.args}.plot",
    ]
    if scope.data:
        options.append(f"len({n.train}) > 0")
    if scope.loop:
        options += [
            f"{n.iteration} % 20 == 0",
            f"{n.iteration} % 100 == 0",
            f"{n.train_iter}.is_new_epoch",
            f"{n.iteration} > 0",
        ]
    if scope.loop_vars:
        options.append(f"{scope.loop_vars[-1]} == 0")
    return options


@st.composite
def user_blocks(draw: st.DrawFn, scope: Scope, depth: int) -> list[Stmt]:
    """One user ``if``/``if-else``/``for``/``while``/``try``/``with`` around a mixed body."""
    kind = draw(st.sampled_from(["if", "if", "if-else", "for", "while", "try", "with"]))
    if kind in ("if", "if-else"):
        test = draw(st.sampled_from(_conditions(scope)))
        body = tuple(draw(mixed_blocks(scope, depth + 1)))
        clauses: tuple[tuple[str, tuple[Stmt, ...]], ...] = ()
        if kind == "if-else":
            if draw(st.booleans()):
                other = draw(st.sampled_from(_conditions(scope)))
                clauses += ((f"elif {other}", tuple(draw(mixed_blocks(scope, depth + 1)))),)
            clauses += (("else", tuple(draw(mixed_blocks(scope, depth + 1)))),)
        return [Block(f"if {test}", body, clauses)]
    if kind == "for":
        var = draw(st.sampled_from(["k", "j", "name", "key"]))
        if var == "key":
            header = f"for key, value in sorted(vars({scope.names.args}).items())"
        elif var == "name":
            header = "for name in ('loss', 'accuracy')"
        else:
            header = f"for {var} in range(3)"
        inner = replace(scope, loop_vars=(*scope.loop_vars, var))
        return [Block(header, tuple(draw(mixed_blocks(inner, depth + 1))))]
    if kind == "while":
        counter = draw(st.sampled_from(["tries", "attempt", "rounds"]))
        body = (*draw(mixed_blocks(scope, depth + 1)), Line(f"{counter} += 1"))
        return [Line(f"{counter} = 0"), Block(f"while {counter} < 2", body)]
    if kind == "try":
        body = tuple(draw(mixed_blocks(scope, depth + 1)))
        handler = draw(
            st.sampled_from(
                ["except (IOError, OSError) as e", "except Exception as e", "except KeyError"]
            )
        )
        handled = tuple(draw(mixed_blocks(scope, depth + 1)))
        clauses = ((handler, handled),)
        if draw(st.booleans()):
            clauses += (("finally", tuple(draw(mixed_blocks(scope, depth + 1)))),)
        return [Block("try", body, clauses)]
    header = draw(
        st.sampled_from(
            [
                "with chainer.using_config('train', False)",
                "with chainer.no_backprop_mode()",
                "with chainer.using_config('train', False), chainer.no_backprop_mode()",
            ]
        )
    )
    return [Block(header, tuple(draw(mixed_blocks(scope, depth + 1))))]


@st.composite
def mixed_blocks(draw: st.DrawFn, scope: Scope, depth: int = 1) -> list[Stmt]:
    """1-4 statements: writers/collectives/bookkeeping and user blocks nested to MAX_DEPTH,
    some with a comment line above them (comments must survive conversion)."""
    count = draw(st.integers(1, 4 if depth == 1 else 3))
    out: list[Stmt] = []
    for _ in range(count):
        if draw(st.integers(0, 9)) == 0:
            out.append(Line(f"# {draw(st.sampled_from(_COMMENTS))}"))
        nest = depth < MAX_DEPTH and draw(st.integers(0, 9)) < (5 if depth == 1 else 3)
        out += draw(user_blocks(scope, depth)) if nest else draw(leaves(scope))
    return out


_COMMENTS = (
    "report progress",
    "TODO: make this configurable",
    "save what we have so far",
    "only needed for debugging",
)


# ------------------------------------------------------------------------ script sections


@st.composite
def names_strategy(draw: st.DrawFn) -> Names:
    train, test = draw(
        st.sampled_from(
            [("train", "test"), ("train_data", "test_data"), ("ds_train", "ds_val"), ("trn", "tst")]
        )
    )
    train_iter, test_iter = draw(
        st.sampled_from([("train_iter", "test_iter"), ("train_it", "val_it"), ("it", "eval_it")])
    )
    return Names(
        args=draw(st.sampled_from(["args", "opts", "cfg"])),
        model=draw(st.sampled_from(["model", "net", "clf"])),
        model_class=draw(st.sampled_from(["MLP", "Net", "ConvNet", "Classifier5"])),
        optimizer=draw(st.sampled_from(["optimizer", "opt"])),
        train=train,
        test=test,
        train_iter=train_iter,
        test_iter=test_iter,
        trainer=draw(st.sampled_from(["trainer", "tr"])),
        iteration=draw(st.sampled_from(["iteration", "step", "n_iter"])),
        evaluator=draw(st.sampled_from(["evaluator", "ev"])),
        comm=draw(st.sampled_from(["comm", "communicator"])),
        mn=draw(st.sampled_from(["chainermn", "mn"])),
    )


def _argument_lines(device: str) -> list[Stmt]:
    device_line = (
        "parser.add_argument('--gpu', '-g', type=int, default=-1, help='GPU ID (negative: CPU)')"
        if device == "gpu"
        else "parser.add_argument('--device', '-d', type=str, default='-1', "
        "help='Device specifier')"
    )
    return [
        Line("parser = argparse.ArgumentParser(description='Chainer example')"),
        Line("parser.add_argument('--batchsize', '-b', type=int, default=100)"),
        Line("parser.add_argument('--epoch', '-e', type=int, default=20)"),
        Line(device_line),
        Line("parser.add_argument('--out', '-o', default='result')"),
        Line("parser.add_argument('--resume', '-r', default='')"),
        Line("parser.add_argument('--unit', '-u', type=int, default=1000)"),
        Line("parser.add_argument('--dataset', default='mnist')"),
        Line("parser.add_argument('--verbose', action='store_true')"),
        Line("parser.add_argument('--noplot', dest='plot', action='store_false')"),
    ]


@st.composite
def dataset_loads(draw: st.DrawFn, scope: Scope) -> tuple[list[Stmt], list[Stmt]]:
    """Statements binding ``train``/``test`` on every path, and module helpers they need."""
    n = scope.names
    pair = f"{n.train}, {n.test}"
    getter = draw(
        st.sampled_from(
            [
                "chainer.datasets.get_mnist()",
                "chainer.datasets.get_mnist(ndim=3)",
                "chainer.datasets.get_cifar10()",
                "chainer.datasets.get_cifar100()",
            ]
        )
    )
    helpers: list[Stmt] = []
    kind = draw(st.integers(0, 8))
    after = replace(scope, data=True)
    if kind == 0:
        stmts: list[Stmt] = [Line(f"{pair} = {getter}")]
    elif kind == 1:  # the user's loader
        helper = draw(st.sampled_from(["load_dataset", "get_data", "prepare_datasets"]))
        helpers.append(
            Block(
                f"def {helper}(name)",
                (
                    Block("if name == 'cifar10'", (Line("return chainer.datasets.get_cifar10()"),)),
                    Line("return chainer.datasets.get_mnist()"),
                ),
            )
        )
        stmts = [Line(f"{pair} = {helper}({n.args}.dataset)")]
    elif kind == 2:  # if/elif/else on the dataset name
        stmts = [
            Block(
                f"if {n.args}.dataset == 'cifar10'",
                (Line(f"{pair} = chainer.datasets.get_cifar10()"),),
                (
                    (
                        f"elif {n.args}.dataset == 'cifar100'",
                        (Line(f"{pair} = chainer.datasets.get_cifar100()"),),
                    ),
                    ("else", (Line(f"{pair} = chainer.datasets.get_mnist()"),)),
                ),
            )
        ]
    elif kind == 3:  # try/except fallback
        stmts = [
            Block(
                "try",
                (Line(f"{pair} = {getter}"),),
                (
                    (
                        "except (IOError, OSError)",
                        (
                            Line("print('download failed, using CIFAR-10')"),
                            Line(f"{pair} = chainer.datasets.get_cifar10()"),
                        ),
                    ),
                ),
            )
        ]
    elif kind == 4:  # split off a validation set
        whole = draw(st.sampled_from(["full", "trainval"]))
        stmts = [
            Line(f"{whole}, _ = {getter}"),
            Line(
                f"{pair} = chainer.datasets.split_dataset_random({whole}, "
                f"int(len({whole}) * 0.9), seed=0)"
            ),
        ]
    elif kind == 5:  # built from arrays
        stmts = [
            Line("x = np.random.rand(100, 784).astype(np.float32)"),
            Line("y = np.random.randint(0, 10, size=100).astype(np.int32)"),
            Line(f"{n.train} = chainer.datasets.TupleDataset(x[:80], y[:80])"),
            Line(f"{n.test} = chainer.datasets.TupleDataset(x[80:], y[80:])"),
        ]
    elif kind == 6:  # loaded, then transformed
        stmts = [
            Line(f"{pair} = {getter}"),
            Line(f"{n.train} = chainer.datasets.TransformDataset({n.train}, lambda e: e)"),
        ]
    elif kind == 7:  # loaded, user code that reads it, then transformed (a redefinition)
        stmts = [
            Line(f"{pair} = {getter}"),
            *draw(user_blocks(after, 1)),
            Line(f"{n.train} = chainer.datasets.TransformDataset({n.train}, lambda e: e)"),
        ]
    else:  # one set, user code, the other set
        stmts = [
            Line(f"{n.train} = {getter}[0]"),
            *draw(user_blocks(replace(scope, data=False), 1)),
            Line(f"{n.test} = {getter}[1]"),
        ]
    where = draw(st.integers(0, 3))
    if where == 1:  # a print about the data right after loading
        stmts.append(draw(prints(after))[0])
    elif where == 2:  # a user block (with writers) right after loading
        stmts += draw(user_blocks(after, 1))
    return stmts, helpers


def _iterators(names: Names, multiprocess: bool) -> list[Stmt]:
    cls = "MultiprocessIterator" if multiprocess else "SerialIterator"
    extra = ", n_processes=2" if multiprocess else ""
    return [
        Line(
            f"{names.train_iter} = chainer.iterators.{cls}({names.train}, "
            f"{names.args}.batchsize{extra})"
        ),
        Line(
            f"{names.test_iter} = chainer.iterators.{cls}({names.test}, {names.args}.batchsize, "
            f"repeat=False, shuffle=False{extra})"
        ),
    ]


def _device_setup(names: Names, device: str) -> tuple[list[Stmt], str]:
    """Model-to-device statements and the expression the updater/converter gets as device."""
    if device == "gpu":
        stmts: list[Stmt] = [
            Block(
                f"if {names.args}.gpu >= 0",
                (
                    Line(f"chainer.backends.cuda.get_device_from_id({names.args}.gpu).use()"),
                    Line(f"{names.model}.to_gpu()"),
                ),
            )
        ]
        return stmts, f"{names.args}.gpu"
    return [
        Line(f"device = chainer.get_device({names.args}.device)"),
        Line(f"{names.model}.to_device(device)"),
        Line("device.use()"),
    ], "device"


@st.composite
def trainer_sections(draw: st.DrawFn, scope: Scope, device: str) -> list[Stmt]:
    """Updater, Trainer, extensions mixed with user blocks, resume, ``trainer.run()``."""
    n = scope.names
    evaluator = f"extensions.Evaluator({n.test_iter}, {n.model}, device={device})"
    if scope.distributed:
        evaluator = f"{n.mn}.create_multi_node_evaluator({evaluator}, {n.comm})"
    stmts: list[Stmt] = [
        Line(
            f"updater = training.updaters.StandardUpdater({n.train_iter}, {n.optimizer}, "
            f"device={device})"
        ),
        Line(
            f"{n.trainer} = training.Trainer(updater, ({n.args}.epoch, 'epoch'), out={n.args}.out)"
        ),
    ]
    standard = [
        [Line(f"{n.trainer}.extend({evaluator})")],
        [Line(f"{n.trainer}.extend(extensions.LogReport())")],
        [Line(f"{n.trainer}.extend(extensions.PrintReport(['epoch', 'main/loss']))")],
        [Line(f"{n.trainer}.extend(extensions.ProgressBar())")],
        [Line(f"{n.trainer}.extend(extensions.snapshot(), trigger=(1, 'epoch'))")],
        draw(plot_reports(scope)),
    ]
    chosen = draw(st.lists(st.sampled_from(range(len(standard))), unique=True, min_size=1))
    parts = [standard[i] for i in chosen]
    extra = draw(st.integers(0, 2))
    for _ in range(extra):
        parts.insert(draw(st.integers(0, len(parts))), draw(mixed_blocks(scope)))
    for part in parts:
        stmts += part
    if draw(st.booleans()):
        stmts.append(
            Block(
                f"if {n.args}.resume",
                (Line(f"chainer.serializers.load_npz({n.args}.resume, {n.trainer})"),),
            )
        )
    stmts.append(Line(f"{n.trainer}.run()"))
    return stmts


@st.composite
def custom_loops(draw: st.DrawFn, scope: Scope, device: str) -> tuple[list[Stmt], list[Stmt]]:
    """A hand-written loop: update, then user blocks; per epoch an evaluation block. Also
    returns module-level helpers it calls (a progress logger called from the loop body)."""
    n = scope.names
    stmts: list[Stmt] = []
    helpers: list[Stmt] = []
    has_evaluator = draw(st.booleans())
    if has_evaluator:
        evaluator = f"extensions.Evaluator({n.test_iter}, {n.model}, device={device})"
        if scope.distributed:
            evaluator = f"{n.mn}.create_multi_node_evaluator({evaluator}, {n.comm})"
        stmts.append(Line(f"{n.evaluator} = {evaluator}"))
    report_helper = has_evaluator and draw(st.booleans())
    if report_helper:
        helpers.append(_REPORT_HELPER)
    inner = replace(scope, loop=True, evaluator=has_evaluator, report_helper=report_helper)
    body: list[Stmt] = [
        Line(f"batch = {n.train_iter}.next()"),
        Line(f"x, t = chainer.dataset.concat_examples(batch, {device})"),
    ]
    if draw(st.booleans()):
        body.append(Line(f"{n.optimizer}.update({n.model}, x, t)"))
    else:
        body += [
            Line(f"loss = {n.model}(x, t)"),
            Line(f"{n.model}.cleargrads()"),
            Line("loss.backward()"),
            Line(f"{n.optimizer}.update()"),
        ]
    counting = draw(st.booleans())
    if counting:
        stmts.append(Line(f"{n.iteration} = 0"))
        header = f"while {n.train_iter}.epoch < {n.args}.epoch"
        body.append(Line(f"{n.iteration} += 1"))
    else:
        header = f"for {n.iteration} in range({n.args}.epoch * 100)"
    body += draw(mixed_blocks(inner))
    if draw(st.booleans()):
        logger = Scope(names=replace(n, args="opts", iteration="step", train_iter="it"), loop=True)
        helpers.append(
            Block("def log_progress(opts, step, it)", tuple(draw(mixed_blocks(logger, 2))))
        )
        body.append(Line(f"log_progress({n.args}, {n.iteration}, {n.train_iter})"))
    if draw(st.booleans()):
        epoch_end: list[Stmt] = [draw(prints(inner))[0]]
        if has_evaluator or scope.eval_helper:
            epoch_end += draw(evaluations(inner))
        if draw(st.booleans()):
            epoch_end += draw(mixed_blocks(inner, 2))
        body.append(Block(f"if {n.train_iter}.is_new_epoch", tuple(epoch_end)))
    if draw(st.booleans()):
        body += draw(mixed_blocks(inner))
    stmts.append(Block(header, tuple(body)))
    return stmts, helpers


_BANNER = Block(
    "def banner()",
    (
        Line("print('Chainer version:', chainer.__version__)"),
        Block("if chainer.backends.cuda.available", (Line("print('CUDA is available')"),)),
    ),
)

_REPORT_HELPER = Block(
    "def report(evaluator, epoch)",
    (Line("result = evaluator()"), Line("print('epoch', epoch, result)")),
)

_EVALUATE_HELPER = Block(
    "def evaluate(model, iterator)",
    (
        Line("iterator.reset()"),
        Line("total = 0.0"),
        Block(
            "with chainer.using_config('train', False), chainer.no_backprop_mode()",
            (
                Block(
                    "for batch in iterator",
                    (
                        Line("x, t = chainer.dataset.concat_examples(batch)"),
                        Line("total += float(model(x, t).array)"),
                    ),
                ),
            ),
        ),
        Line("return total"),
    ),
)


def _model_class(name: str) -> Block:
    return Block(
        f"class {name}(chainer.Chain)",
        (
            Block(
                "def __init__(self, n_units, n_out)",
                (
                    Line("super().__init__()"),
                    Block(
                        "with self.init_scope()",
                        (
                            Line("self.l1 = L.Linear(None, n_units)"),
                            Line("self.l2 = L.Linear(None, n_out)"),
                        ),
                    ),
                ),
            ),
            Block("def forward(self, x)", (Line("return self.l2(F.relu(self.l1(x)))"),)),
        ),
    )


_IMPORTS = [
    "import argparse",
    "import json",
    "import os",
    "import time",
    "",
    "import numpy as np",
    "",
    "import chainer",
    "import chainer.functions as F",
    "import chainer.links as L",
    "from chainer import serializers, training",
    "from chainer.training import extensions",
]


@dataclass(frozen=True)
class Skeleton:
    """A generated script and the facts about it the properties and statistics need."""

    source: str
    distributed: bool
    layout: str
    training: str

    def __repr__(self) -> str:  # the source itself is shown by the tests' note()
        lines = self.source.count("\n")
        kind = "distributed" if self.distributed else "single-GPU"
        return f"Skeleton({kind}, {self.layout}, {self.training}, {lines} lines)"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints falsifying examples with its pretty printer, not repr()."""
        printer.text(repr(self))


@st.composite
def skeletons(draw: st.DrawFn, distributed: bool | None = None) -> Skeleton:
    """A whole Chainer 7 training script (see the module docstring)."""
    n = draw(names_strategy())
    if distributed is None:
        distributed = draw(st.sampled_from([False] * 9 + [True]))  # about one in ten
    device = draw(st.sampled_from(["gpu", "device"]))
    layout = draw(st.sampled_from(["main-guarded", "main-bare", "module-guarded", "module-bare"]))
    args_style = draw(st.sampled_from(["inline", "helper"]))
    if layout.startswith("module"):
        args_style = "inline"
    training_kind = draw(st.sampled_from(["trainer", "loop"]))
    scope = Scope(names=n, distributed=distributed)

    module_helpers: list[Stmt] = []
    body: list[Stmt] = []
    if draw(st.booleans()):  # a helper that prints, called before the communicator can exist
        module_helpers.append(_BANNER)
        body.append(Line("banner()"))
    if args_style == "helper":
        module_helpers.append(
            Block(
                "def parse_args()", (*_argument_lines(device), Line("return parser.parse_args()"))
            )
        )
        body.append(Line(f"{n.args} = parse_args()"))
    else:
        body += _argument_lines(device)
        body.append(Line(f"{n.args} = parser.parse_args()"))
    if distributed:
        body.append(Line(f"{n.comm} = {n.mn}.create_communicator('naive')"))

    # header prints, possibly inside user blocks, possibly in a helper called from here
    header = draw(mixed_blocks(scope))
    if distributed and draw(st.booleans()):
        header = [Block(f"if {n.comm}.rank == 0", tuple(header))]
    body += header
    if draw(st.booleans()):
        helper = draw(st.sampled_from(["show_config", "log_header"]))
        inner = Scope(names=replace(n, args="config"))  # no comm in there: main owns it
        module_helpers.append(Block(f"def {helper}(config)", tuple(draw(mixed_blocks(inner)))))
        body.append(Line(f"{helper}({n.args})"))

    body.append(Line(f"{n.model} = L.Classifier({n.model_class}({n.args}.unit, 10))"))
    device_stmts, device_expr = _device_setup(n, device)
    body += device_stmts
    make_opt = draw(
        st.sampled_from(["chainer.optimizers.Adam()", "chainer.optimizers.MomentumSGD(lr=0.01)"])
    )
    if distributed:
        make_opt = f"{n.mn}.create_multi_node_optimizer({make_opt}, {n.comm})"
    body.append(Line(f"{n.optimizer} = {make_opt}"))
    body.append(Line(f"{n.optimizer}.setup({n.model})"))

    loads, data_helpers = draw(dataset_loads(scope))
    module_helpers += data_helpers
    iterators = _iterators(n, draw(st.integers(0, 4)) == 0)
    after = replace(scope, data=True)
    if distributed:
        body.append(
            Block(
                f"if {n.comm}.rank == 0",
                tuple(loads),
                (("else", (Line(f"{n.train}, {n.test} = None, None"),)),),
            )
        )
        body.append(Line(f"{n.train} = {n.mn}.scatter_dataset({n.train}, {n.comm}, shuffle=True)"))
        body.append(Line(f"{n.test} = {n.mn}.scatter_dataset({n.test}, {n.comm})"))
        body += iterators
    else:
        data_layout = draw(st.sampled_from(["flat", "flat", "branches", "try", "with"]))
        if data_layout == "flat":
            body += loads + iterators
        elif data_layout == "branches":  # each branch loads and builds its own iterators
            other = [Line(f"{n.train}, {n.test} = chainer.datasets.get_mnist()")]
            other += draw(mixed_blocks(after, 2)) if draw(st.booleans()) else []
            body.append(
                Block(
                    f"if {n.args}.dataset == 'cifar10'",
                    (Line(f"{n.train}, {n.test} = chainer.datasets.get_cifar10()"), *iterators),
                    (("else", (*other, *iterators)),),
                )
            )
        elif data_layout == "try":  # loading and iterators inside try, a fallback in except
            fallback = [Line(f"{n.train}, {n.test} = chainer.datasets.get_mnist()"), *iterators]
            body.append(
                Block(
                    "try", (*loads, *iterators), (("except (IOError, OSError)", tuple(fallback)),)
                )
            )
        else:  # under a with block, as data loaded in a config scope
            body.append(
                Block(
                    "with chainer.using_config('dtype', np.float32)",
                    (
                        *loads,
                        *iterators,
                        *(draw(mixed_blocks(after, 2)) if draw(st.booleans()) else []),
                    ),
                )
            )
    scope = replace(scope, data=True, model=True)
    if draw(st.booleans()):
        body += draw(mixed_blocks(scope))  # between setup and training

    if training_kind == "trainer":
        body += draw(trainer_sections(replace(scope, trainer=True), device_expr))
    else:
        eval_helper = draw(st.booleans())
        if eval_helper:
            module_helpers.append(_EVALUATE_HELPER)
        loop, loop_helpers = draw(
            custom_loops(replace(scope, eval_helper=eval_helper), device_expr)
        )
        body += loop
        module_helpers += loop_helpers

    # the tail after training: saves, writes, prints, maybe through a helper
    if draw(st.booleans()):
        helper = draw(st.sampled_from(["save_results", "write_summary", "finish"]))
        inner = Scope(names=replace(n, args="opts", model="net", optimizer="opt"), model=True)
        module_helpers.append(
            Block(f"def {helper}(opts, net, opt)", tuple(draw(mixed_blocks(inner))))
        )
        body.append(Line(f"{helper}({n.args}, {n.model}, {n.optimizer})"))
    if draw(st.booleans()):
        body += draw(mixed_blocks(scope))

    lines = ["#!/usr/bin/env python", '"""A generated Chainer training script."""', *_IMPORTS]
    if distributed:
        lines.append(
            "import chainermn" if n.mn == "chainermn" else "from mnify import runtime as mn"
        )
    lines += ["", ""]
    for stmt in [_model_class(n.model_class), *module_helpers]:
        lines += render([stmt])
        lines += ["", ""]
    if layout.startswith("main"):
        lines += render([Block("def main()", tuple(body))])
        lines += ["", ""]
        if layout == "main-guarded":
            lines += render([Block("if __name__ == '__main__'", (Line("main()"),))])
        else:
            lines.append("main()")
    elif layout == "module-guarded":
        lines += render([Block("if __name__ == '__main__'", tuple(body))])
    else:
        lines += render(body)
    return Skeleton(
        source="\n".join(lines) + "\n",
        distributed=distributed,
        layout=layout,
        training=training_kind,
    )
