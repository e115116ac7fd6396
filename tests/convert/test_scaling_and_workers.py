"""Batch and learning-rate semantics (issue 12, pattern 10) and loader workers (pattern 12).

Checked on the converted code's AST and on the report's entries; the runtime warm-up on a real
Trainer; and, on 2 MPI ranks, the learning rate the converted ImageNet-style fixture logs
(mnify and ChainerMN targets) and strong scaling's parity with one process at the global batch.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mnify.cli.convert import convert as convert_command
from mnify.converter.driver import FileResult
from tests.convert.ast_checks import assert_has_statement, assert_no_name, index_of, is_statement
from tests.convert.cases import BY_NAME, FIXTURES
from tests.convert.converting import convert
from tests.support.mpirun import mpi_env, run_ranks

IMAGENET = FIXTURES / "imagenet_loaderjob.in.py"
MNIST = FIXTURES / "mnist_mlp.in.py"
MULTIBOX = FIXTURES / "multibox_loop.in.py"


def entries(result: FileResult, step: str, severity: str | None = None) -> list[tuple[int, str]]:
    return [
        (e.line, e.message)
        for e in result.entries
        if e.step == step and (severity is None or e.severity == severity)
    ]


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    """Calls whose function is spelt ``name`` (``print``, ``mn.LinearWarmup``)."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == name]


def keyword(call: ast.Call, name: str) -> str | None:
    for kw in call.keywords:
        if kw.arg == name:
            return ast.unparse(kw.value)
    return None


def line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


# ---------------------------------------------------------------------------- batch report
def test_report_states_per_rank_and_global_batch() -> None:
    source = IMAGENET.read_text(encoding="utf-8")
    site = line_of(source, "train_iter = chainer.iterators.MultiprocessIterator(")
    weak = entries(convert(source), "scaling")
    assert (
        site,
        "weak scaling: per-rank batch args.batchsize, global batch args.batchsize * comm.size "
        "(N ranks train with N times the batch of the original run; an epoch takes 1/N of the "
        "iterations)",
    ) in weak
    strong = convert(source, scaling="strong")
    assert (
        site,
        "strong scaling: per-rank batch args.batchsize // comm.size, global batch "
        "args.batchsize as written",
    ) in entries(strong, "scaling", "changed")
    # the evaluation iterator's batch is neither divided nor reported
    val = line_of(source, "val_iter = chainer.iterators.MultiprocessIterator(")
    assert not [m for line, m in entries(strong, "scaling") if line == val]


@pytest.mark.parametrize("scaling", ["weak", "strong"])
def test_minibatch_print_shows_the_other_figure_in_one_statement(scaling: str) -> None:
    source = IMAGENET.read_text(encoding="utf-8")
    result = convert(source, scaling=scaling)
    assert result.output is not None
    tree = ast.parse(result.output)
    prints = [c for c in calls(tree, "print") if "Minibatch-size" in ast.unparse(c)]
    assert len(prints) == 1
    args = [ast.unparse(a) for a in prints[0].args]
    if scaling == "weak":
        want = "'(per rank; global: {})'.format(args.batchsize * comm.size)"
    else:
        want = "'(global; per rank: {})'.format(args.batchsize // comm.size)"
    assert args == ["'# Minibatch-size: {}'.format(args.batchsize)", want]
    # still one statement, directly under the rank-0 guard the prints already get
    holders = [
        s
        for s in ast.walk(tree)
        if isinstance(s, ast.If)
        and any(isinstance(b, ast.Expr) and b.value is prints[0] for b in s.body)
    ]
    assert len(holders) == 1 and ast.unparse(holders[0].test) == "comm.rank == 0"
    # the other prints are unchanged
    assert_has_statement(
        result.output,
        "if comm.rank == 0:\n    ...\n    print('# epoch: {}'.format(args.epoch))\n    ...",
        within="main",
    )


def test_prints_in_loops_or_without_the_batch_are_left_alone() -> None:
    source = textwrap.dedent(
        """\
        import argparse
        import chainer

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument('--batchsize', type=int, default=8)
            args = parser.parse_args()
            print('epoch size', 100)
            train = chainer.datasets.TupleDataset([1, 2], [3, 4])
            it = chainer.iterators.SerialIterator(train, args.batchsize)
            opt = chainer.optimizers.SGD()
            for i in range(3):
                print('batch', args.batchsize)
        """
    )
    result = convert(source)
    assert result.output is not None
    for call in calls(ast.parse(result.output), "print"):
        assert not [n for n in ast.walk(call) if isinstance(n, ast.Name) and n.id == "comm"]
    assert not [m for _, m in entries(result, "scaling") if "print" in m]


# ---------------------------------------------------------------------------- iteration schedules
def test_weak_scaling_reports_what_counts_iterations() -> None:
    source = IMAGENET.read_text(encoding="utf-8")
    notes = dict(entries(convert(source), "scaling", "info"))
    shift = line_of(source, "trainer.extend(extensions.ExponentialShift('lr', 0.5),")
    assert notes[shift].startswith("ExponentialShift triggered by iteration: each iteration")
    for text in ("val_interval = args.val_interval", "log_interval = args.log_interval"):
        assert notes[line_of(source, text)].startswith("interval counted in iterations")
    # the epoch-based stop trigger is not an iteration schedule
    assert line_of(source, "trainer = training.Trainer(") not in notes
    strong = convert(source, scaling="strong")
    assert not [m for _, m in entries(strong, "scaling", "info") if "iteration" in m]


def test_iteration_stop_trigger_and_counting_shifts_are_reported() -> None:
    source = textwrap.dedent(
        """\
        import chainer
        from chainer import training
        from chainer.training import extensions

        def main():
            train = chainer.datasets.TupleDataset([1.0, 2.0], [0, 1])
            it = chainer.iterators.SerialIterator(train, 2)
            opt = chainer.optimizers.MomentumSGD()
            updater = training.updaters.StandardUpdater(it, opt)
            trainer = training.Trainer(updater, (1000, 'iteration'))
            trainer.extend(extensions.LinearShift('lr', (0.1, 0.0), (0, 1000)))
            trainer.extend(extensions.PolynomialShift('lr', 0.9, 1000), trigger=(1, 'epoch'))
        """
    )
    notes = dict(entries(convert(source), "scaling", "info"))
    assert "the Trainer stops after a number of iterations" in notes[line_of(source, "Trainer(")]
    assert notes[line_of(source, "LinearShift")].startswith("LinearShift counts its steps")
    assert line_of(source, "PolynomialShift") not in notes  # triggered by epoch


# ---------------------------------------------------------------------------- --scale-lr
def test_scale_lr_is_never_a_default() -> None:
    result = convert(IMAGENET.read_text(encoding="utf-8"))
    assert result.output is not None
    assert_no_name(result.output, "LinearWarmup", "LinearShift")
    assert any("--scale-lr linear applies" in m for _, m in entries(result, "scaling", "info"))


def test_scale_lr_linear_adds_the_warm_up_right_after_the_trainer() -> None:
    source = IMAGENET.read_text(encoding="utf-8")
    result = convert(source, scale_lr="linear", warmup_epochs=3)
    assert result.output is not None
    tree = ast.parse(result.output)
    main = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main")
    at = index_of(main.body, "trainer = training.Trainer(...)")
    assert is_statement(
        main.body[at + 1], "trainer.extend(mn.LinearWarmup(comm.size, warmup_epochs=3))"
    )
    assert len(calls(tree, "mn.LinearWarmup")) == 1
    # the script's own rate and schedule are untouched: the extension scales on top of them
    assert_has_statement(
        result.output,
        "optimizer = mn.create_multi_node_optimizer("
        "chainer.optimizers.MomentumSGD(lr=args.lr, momentum=0.9), comm)",
        within="main",
    )
    assert_has_statement(
        result.output,
        "trainer.extend(extensions.ExponentialShift('lr', 0.5), trigger=(args.lr_step, 'iteration'))",
        within="main",
    )
    changed = entries(result, "scaling", "changed")
    assert (
        line_of(source, "trainer = training.Trainer("),
        "learning rate (MomentumSGD: lr) times comm.size, reached by a linear warm-up over 3 "
        "epochs (mn.LinearWarmup); the script's own lr schedule is scaled with it",
    ) in changed


def test_scale_lr_ignored_with_strong_scaling() -> None:
    result = convert(IMAGENET.read_text(encoding="utf-8"), scaling="strong", scale_lr="linear")
    assert result.output is not None
    assert_no_name(result.output, "LinearWarmup")
    assert any("--scale-lr linear ignored" in m for _, m in entries(result, "scaling", "info"))


def test_chainermn_target_gets_chainers_linear_shift_for_adam_alpha() -> None:
    result = convert(MNIST.read_text(encoding="utf-8"), target="chainermn", scale_lr="linear")
    assert result.output is not None
    assert_no_name(result.output, "mnify", "LinearWarmup")
    shifts = calls(ast.parse(result.output), "extensions.LinearShift")
    assert len(shifts) == 1
    args = [ast.unparse(a) for a in shifts[0].args]
    assert args == [
        "'alpha'",
        "(optimizer.alpha, optimizer.alpha * comm.size)",
        "(0, 5 * len(train_iter.dataset) // train_iter.batch_size)",
    ]
    assert keyword(shifts[0], "optimizer") == "optimizer"


def test_chainermn_target_does_not_fight_the_scripts_own_lr_shift() -> None:
    source = IMAGENET.read_text(encoding="utf-8")
    result = convert(source, target="chainermn", scale_lr="linear")
    assert result.output is not None
    assert_no_name(result.output, "LinearShift")
    people = entries(result, "scaling", "needs-person")
    assert [line for line, _ in people] == [line_of(source, "ExponentialShift('lr', 0.5)")]
    assert "ExponentialShift also sets 'lr'" in people[0][1]


def test_custom_loop_lr_scaling_goes_to_a_person() -> None:
    source = MULTIBOX.read_text(encoding="utf-8")
    plain = convert(source)
    linear = convert(source, scale_lr="linear")
    assert linear.output == plain.output  # nothing guessed
    people = [m for _, m in entries(linear, "scaling", "needs-person") if "--scale-lr" in m]
    assert len(people) == 1
    assert (
        "optimizer.lr = base * (1 + (comm.size - 1) * min(1.0, train_iter.epoch_detail / 5))"
        in (people[0])
    )


def test_cli_scale_lr_options() -> None:
    runner = CliRunner()
    bad = runner.invoke(convert_command, [str(MNIST), "--warmup-epochs", "2"])
    assert (
        bad.exit_code == 2 and "--warmup-epochs only applies with --scale-lr linear" in bad.output
    )
    good = runner.invoke(
        convert_command, [str(MNIST), "--scale-lr", "linear", "--warmup-epochs", "2"]
    )
    assert good.exit_code == 0, good.output
    warmed = convert(
        MNIST.read_text(encoding="utf-8"), str(MNIST), scale_lr="linear", warmup_epochs=2
    )
    assert_has_statement(
        warmed.output or "",
        "trainer.extend(mn.LinearWarmup(comm.size, warmup_epochs=2))",
        within="main",
    )
    assert good.stdout == warmed.diff()
    default = runner.invoke(convert_command, [str(MNIST)])
    assert default.exit_code == 0
    plain = convert(MNIST.read_text(encoding="utf-8"), str(MNIST))
    assert_no_name(plain.output or "", "LinearWarmup")
    assert default.stdout == plain.diff()


# ---------------------------------------------------------------------------- count-normalised loss
def test_hard_negative_mining_loss_needs_a_person() -> None:
    source = MULTIBOX.read_text(encoding="utf-8")
    people = [
        (line, m)
        for line, m in entries(convert(source), "scaling", "needs-person")
        if m.startswith("loss divided by")
    ]
    assert [line for line, _ in people] == [
        line_of(source, "loc_loss = F.sum(loc_loss) / n_positive"),
        line_of(source, "conf_loss = F.sum(conf_loss) / n_positive"),
    ]
    assert "`n_positive = comm.allreduce_obj(float(n_positive)) / comm.size`" in people[0][1]


LOSSES = """\
import chainer
import chainer.functions as F


def {name}(y, t, x, batchsize):
{body}
"""


@pytest.mark.parametrize(
    ("body", "flagged"),
    [
        ("    return F.sum(F.squared_error(y, t)) / len(t)", False),
        ("    return F.sum(F.squared_error(y, t)) / batchsize", False),
        ("    return F.sum(F.squared_error(y, t)) / x.shape[0]", False),
        ("    return F.sum(F.squared_error(y, t)) / y.size", False),
        ("    return F.mean(F.squared_error(y, t))", False),
        ("    n = sum(len(b) for b in x)\n    return F.sum(y) / n", False),
        ("    n = (t > 0).sum()\n    return F.sum(y) / n", True),
        ("    n = max((t > 0).sum(), 1)\n    return F.sum(y) / n", True),
        (
            "    valid = t != -1\n    loss = F.sum(y * valid)\n    loss /= valid.sum()\n    return loss",
            True,
        ),
        ("    return F.sum(y) / float(chainer.backend.get_array_module(t).count_nonzero(t))", True),
        (
            "    n = (t > 0).sum()\n    n = comm.allreduce_obj(float(n)) / comm.size\n"
            "    return F.sum(y) / n",
            False,
        ),
    ],
)
def test_count_normalised_losses_are_found_precisely(body: str, flagged: bool) -> None:
    source = LOSSES.format(name="loss_fn", body=body)
    found = [
        m for _, m in entries(convert(source), "scaling", "needs-person") if "loss divided" in m
    ]
    assert bool(found) is flagged, found


# ---------------------------------------------------------------------------- workers
WORKERS = """\
import argparse
import chainer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--loaderjob', type=int, default=4)
    args = parser.parse_args()
    train = chainer.datasets.TupleDataset([1.0, 2.0], [0, 1])
    opt = chainer.optimizers.SGD()
    it = {call}
"""


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            "chainer.iterators.MultiprocessIterator(train, 2, n_processes=args.loaderjob)",
            "max(1, args.loaderjob // comm.intra_size)",
        ),
        (
            "chainer.iterators.MultiprocessIterator(train, 2, True, True, 8)",
            "max(1, 8 // comm.intra_size)",
        ),
        (
            "chainer.iterators.MultiprocessIterator(train, 2, n_processes=args.loaderjob + 1)",
            "max(1, (args.loaderjob + 1) // comm.intra_size)",
        ),
        (
            "chainer.iterators.MultiprocessIterator(train, 2)",
            "max(1, multiprocessing.cpu_count() // comm.intra_size)",
        ),
        (
            "chainer.iterators.MultiprocessIterator(train, 2, n_processes=None)",
            "max(1, multiprocessing.cpu_count() // comm.intra_size)",
        ),
    ],
)
@pytest.mark.parametrize("target", ["mnify", "chainermn"])
def test_multiprocess_workers_are_divided_by_the_ranks_on_a_node(
    call: str, expected: str, target: str
) -> None:
    result = convert(WORKERS.format(call=call), target=target, idempotent=True)
    assert result.output is not None
    tree = ast.parse(result.output)
    (made,) = calls(tree, "chainer.iterators.MultiprocessIterator")
    positional = [ast.unparse(a) for a in made.args]
    got = keyword(made, "n_processes") or positional[4]
    assert got == expected
    assert [m for _, m in entries(result, "workers", "changed")]


def test_workers_where_the_communicator_is_not_visible_need_a_person() -> None:
    source = textwrap.dedent(
        """\
        import argparse
        import chainer

        def make_iter(train, jobs):
            return chainer.iterators.MultiprocessIterator(train, 2, n_processes=jobs)

        def main():
            args = argparse.ArgumentParser().parse_args()
            train = chainer.datasets.TupleDataset([1.0, 2.0], [0, 1])
            opt = chainer.optimizers.SGD()
            it = make_iter(train, 2)
        """
    )
    result = convert(source)
    assert result.output is not None
    assert_no_name(result.output, "intra_size")
    assert entries(result, "workers", "needs-person")


# ---------------------------------------------------------------------------- LinearWarmup
def _tiny_trainer(optimizer, n: int = 8, batch: int = 2):  # type: ignore[no-untyped-def]
    import chainer
    import chainer.links as L
    from chainer import training

    model = L.Classifier(L.Linear(3, 2))
    optimizer.setup(model)
    rng = np.random.RandomState(0)
    data = chainer.datasets.TupleDataset(
        rng.rand(n, 3).astype(np.float32), rng.randint(0, 2, n).astype(np.int32)
    )
    it = chainer.iterators.SerialIterator(data, batch, shuffle=False)
    updater = training.updaters.StandardUpdater(it, optimizer)
    return training.Trainer(updater, (2, "epoch"), out="/nonexistent-unused")


def test_linear_warmup_ramps_and_composes_with_an_lr_schedule() -> None:
    import chainer
    from chainer.training import extensions

    from mnify.runtime import LinearWarmup

    optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
    trainer = _tiny_trainer(optimizer)  # 4 iterations per epoch, 8 in all
    seen: list[float] = []
    trainer.extend(LinearWarmup(4, warmup_epochs=1))
    # the schedule is added after the warm-up: priorities, not order, decide who runs last
    trainer.extend(extensions.ExponentialShift("lr", 0.5), trigger=(3, "iteration"))
    trainer.extend(lambda t: seen.append(optimizer.lr), trigger=(1, "iteration"), priority=300)
    trainer.run()
    # lr of update i = 0.1 * 0.5 ** ((i - 1) // 3) * (1 + 3 * min(1, (i - 1) / 4))
    want = [0.1 * 0.5 ** ((i - 1) // 3) * (1 + 3 * min(1.0, (i - 1) / 4)) for i in range(1, 9)]
    np.testing.assert_allclose(seen, want, rtol=1e-12)


def test_linear_warmup_picks_each_optimizers_learning_rate() -> None:
    import chainer

    from mnify.runtime.extensions.warmup import learning_rate_attribute

    assert learning_rate_attribute(chainer.optimizers.Adam()) == "alpha"
    assert learning_rate_attribute(chainer.optimizers.AMSGrad()) == "alpha"
    assert learning_rate_attribute(chainer.optimizers.RMSprop()) == "lr"  # its alpha decays
    assert learning_rate_attribute(chainer.optimizers.SGD()) == "lr"
    assert learning_rate_attribute(chainer.optimizers.AdaDelta()) is None

    from mnify.runtime import LinearWarmup

    adam = chainer.optimizers.Adam(alpha=0.01)
    trainer = _tiny_trainer(adam)
    trainer.extend(LinearWarmup(2, warmup_epochs=0))
    trainer.run()
    assert adam.alpha == pytest.approx(0.02) and adam.beta1 == pytest.approx(0.9)

    delta = chainer.optimizers.AdaDelta()
    trainer = _tiny_trainer(delta)
    trainer.extend(LinearWarmup(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.run()
    assert [w for w in caught if "no learning rate" in str(w.message)]


def test_linear_warmup_resumes_without_scaling_twice(tmp_path: Path) -> None:
    import chainer

    from mnify.runtime import LinearWarmup

    first = chainer.optimizers.SGD(lr=0.1)
    trainer = _tiny_trainer(first)
    trainer.stop_trigger = chainer.training.get_trigger((1, "epoch"))
    trainer.extend(LinearWarmup(3, warmup_epochs=2))
    trainer.run()
    assert first.lr == pytest.approx(0.1 * 2.0)  # factor 1 + 2 * (1 / 2) after one epoch
    chainer.serializers.save_npz(str(tmp_path / "snap"), trainer)

    # Chainer's snapshot keeps no hyperparameter: the resumed optimizer starts at the rate as
    # written; one whose rate was restored by other means holds the scaled value. Either way
    # the warm-up continues from epoch 1 on the unscaled 0.1.
    for restored in (None, 0.2):
        second = chainer.optimizers.SGD(lr=0.1)
        resumed = _tiny_trainer(second)
        resumed.extend(LinearWarmup(3, warmup_epochs=2))
        chainer.serializers.load_npz(str(tmp_path / "snap"), resumed)
        if restored is not None:
            second.lr = restored
        seen: list[float] = []
        resumed.extend(lambda t, o=second, s=seen: s.append(o.lr), priority=300)
        resumed.run()
        # updates 5..8 (epoch 1 to 2): factor 1 + 2 * (i - 1) / 8
        want = [0.1 * (1 + 2 * (i - 1) / 8) for i in range(5, 9)]
        np.testing.assert_allclose(seen, want, rtol=1e-12)
        assert second.lr == pytest.approx(0.1 * 3.0)  # not 0.2 * 3


# ---------------------------------------------------------------------------- on 2 ranks
LAUNCHER = """\
import os, runpy, sys
if __name__ == "__main__":
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    os.makedirs(os.path.join({base!r}, "rank" + rank), exist_ok=True)
    os.chdir(os.path.join({base!r}, "rank" + rank))
    sys.argv = [{script!r}] + {args!r}
    runpy.run_path({script!r}, run_name="__main__")
"""


def _run_two_ranks(text: str, args: list[str], base: Path):  # type: ignore[no-untyped-def]
    base.mkdir(parents=True, exist_ok=True)
    script = base / "train.py"
    script.write_text(text, encoding="utf-8")
    source = LAUNCHER.format(base=str(base), script=str(script), args=args)
    run = run_ranks(2, source, timeout=240, cwd=base)
    assert run.returncode == 0, run.output
    return json.loads((base / "rank0" / "result" / "log").read_text())


RUN = [
    "--synthetic", "32", "--batchsize", "4", "--epoch", "2", "--loaderjob", "2",
    "--val-interval", "4", "--log-interval", "2", "--out", "result",
]  # fmt: skip


@pytest.mark.mpi
def test_converted_fixture_logs_the_warmed_up_scaled_rate(tmp_path: Path) -> None:
    """32 examples over 2 ranks at batch 4: 4 iterations an epoch; warm-up over 1 epoch to
    2 x 0.05, halved every 3 iterations by the script's own ExponentialShift."""
    case = BY_NAME["imagenet_loaderjob"]
    assert case.options.scale_lr == "linear" and case.options.warmup_epochs == 1
    text = case.expected.read_text(encoding="utf-8")
    log = _run_two_ranks(text, [*RUN, "--lr-step", "3"], tmp_path)
    got = {e["iteration"]: e["lr"] for e in log}
    want = {i: 0.05 * 0.5 ** ((i - 1) // 3) * (1 + min(1.0, (i - 1) / 4)) for i in (2, 4, 6, 8)}
    assert got.keys() == want.keys()
    for i in want:
        assert got[i] == pytest.approx(want[i], rel=1e-9), (i, got, want)


@pytest.mark.mpi
def test_chainermn_target_warm_up_runs_on_chainermn(tmp_path: Path) -> None:
    """--target chainermn emits Chainer's LinearShift, and the output runs on ChainerMN 7.8.1."""
    source = IMAGENET.read_text(encoding="utf-8")
    shift = "    trainer.extend(extensions.ExponentialShift('lr', 0.5),\n                   trigger=(args.lr_step, 'iteration'))\n"
    assert shift in source
    result = convert(
        source.replace(shift, ""), target="chainermn", scale_lr="linear", warmup_epochs=1
    )
    assert result.output is not None
    assert_has_statement(result.output, "import chainermn")
    assert_no_name(result.output, "mnify")
    log = _run_two_ranks(result.output, RUN, tmp_path)
    got = {e["iteration"]: e["lr"] for e in log}
    # LinearShift counts its calls: the rate of update i is 0.05 * (1 + min(1, (i - 1) / 4))
    want = {i: 0.05 * (1 + min(1.0, (i - 1) / 4)) for i in (2, 4, 6, 8)}
    assert got == pytest.approx(want, rel=1e-9)


def _params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


@pytest.mark.mpi
def test_strong_scaling_on_two_ranks_reproduces_one_process_at_the_global_batch(
    tmp_path: Path,
) -> None:
    """Per-rank batch b on 2 ranks == one process at 2b: every step is the whole training set
    (so the order of examples does not matter), batch normalization takes its statistics over
    both ranks, and the iteration-based lr schedule and validation fall on the same steps."""
    n = 16
    args = [
        "--synthetic", str(n), "--batchsize", str(n), "--epoch", "3", "--loaderjob", "1",
        "--lr-step", "2", "--val-interval", "3", "--log-interval", "1", "--out", "result",
    ]  # fmt: skip
    single = tmp_path / "single"
    single.mkdir()
    subprocess.run(
        [sys.executable, str(IMAGENET), *args],
        cwd=single,
        env=mpi_env(),
        check=True,
        capture_output=True,
        timeout=240,
    )
    result = convert(IMAGENET.read_text(encoding="utf-8"), scaling="strong")
    assert result.output is not None
    train_iter, _ = calls(ast.parse(result.output), "chainer.iterators.MultiprocessIterator")
    assert ast.unparse(train_iter.args[1]) == "args.batchsize // comm.size"
    many = _run_two_ranks(result.output, args, tmp_path / "ranks")
    one = json.loads((single / "result" / "log").read_text())
    assert [e["iteration"] for e in one] == [e["iteration"] for e in many] == [1, 2, 3]
    np.testing.assert_allclose([e["lr"] for e in many], [e["lr"] for e in one], rtol=1e-12)
    np.testing.assert_allclose(
        [e["validation/main/loss"] for e in many if "validation/main/loss" in e],
        [e["validation/main/loss"] for e in one if "validation/main/loss" in e],
        rtol=1e-5,
    )
    p_one = _params(single / "result" / "model_iter_3")
    p_many = _params(tmp_path / "ranks" / "rank0" / "result" / "model_iter_3")
    assert p_one.keys() == p_many.keys() and p_one
    for key in p_one:
        np.testing.assert_allclose(p_many[key], p_one[key], rtol=1e-5, atol=1e-6, err_msg=key)
