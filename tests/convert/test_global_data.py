"""``mnify convert --data global`` and ``--grow-batch`` (docs/converter.md MN818, MN819): what the
output holds, by syntax tree, and what stays for a person."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, note, seed, settings

from mnify.cli import main
from mnify.converter import ConvertOptions, convert_source
from testkit.properties import check_skeleton
from testkit.skeletons import Skeleton, skeletons
from tests.convert.ast_checks import (
    assert_has_expression,
    assert_has_statement,
    assert_no_expression,
    assert_no_statement,
    contains,
)
from tests.convert.converting import convert
from tests.convert.test_properties import SKELETON_SEED, _slow, budget

TRAINER = """\
import chainer
from chainer import training
from chainer.training import extensions


def main(args):
    model = chainer.links.Classifier(chainer.links.Linear(4, 2))
    optimizer = chainer.optimizers.SGD(lr=0.1)
    optimizer.setup(model)
    train, test = chainer.datasets.get_mnist()
    train_iter = {train_iter}
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'))
    trainer.extend(extensions.Evaluator(test_iter, model))
    trainer.extend({snapshot}, trigger=(1, 'epoch'))
    {decay}
    if args.resume:
        chainer.serializers.load_npz(args.resume, trainer)
    trainer.run()


if __name__ == '__main__':
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument('--batchsize', type=int, default=32)
    parser.add_argument('--epoch', type=int, default=3)
    parser.add_argument('--resume', default='')
    main(parser.parse_args())
"""


def _script(
    train_iter: str = "chainer.iterators.SerialIterator(train, args.batchsize)",
    snapshot: str = "extensions.snapshot(filename='snap_{.updater.epoch}')",
    decay: str = "pass",
) -> str:
    return TRAINER.format(train_iter=train_iter, snapshot=snapshot, decay=decay)


def _people(result: object) -> list[str]:
    return [e.message for e in result.entries if e.severity == "needs-person"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("scaling", "batch"),
    [("weak", "args.batchsize * comm.size"), ("strong", "args.batchsize")],
)
def test_global_data_whole_training_set_global_iterator_and_snapshot(
    scaling: str, batch: str
) -> None:
    out = convert(_script(), data="global", scaling=scaling, idempotent=True).output
    assert out is not None
    # rank 0 loads, every rank gets the whole training set; the test set keeps its scatter
    assert_has_statement(out, "train = mn.bcast_dataset(train, comm)", within="main")
    assert_has_statement(out, "test = mn.scatter_dataset(test, comm)", within="main")
    assert_no_expression(out, "mn.scatter_dataset(train, ...)")
    assert_has_statement(
        out, f"train_iter = mn.create_global_batch_iterator(train, {batch}, comm)", within="main"
    )
    assert_has_statement(
        out, "test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False)"
    )
    assert_has_expression(out, "mn.extensions.global_snapshot(filename='snap_{.updater.epoch}')")
    assert_no_expression(out, "extensions.snapshot(...)")
    # resuming runs on every rank: the load is not under a rank test
    assert_has_statement(
        out,
        "if args.resume:\n    chainer.serializers.load_npz(args.resume, trainer)",
        within="main",
        top_level=True,
    )
    assert not contains(out, "if comm.rank == 0:\n    train_iter = ...")


def test_default_data_is_the_scatter() -> None:
    out = convert(_script()).output
    assert out is not None
    assert_has_statement(out, "train = mn.scatter_dataset(train, comm, shuffle=True)")
    assert_no_expression(out, "mn.create_global_batch_iterator(...)")
    assert_no_expression(out, "mn.extensions.global_snapshot(...)")
    assert convert(_script(), data="scatter").output == out


def test_carried_and_dropped_iterator_arguments() -> None:
    source = _script(
        "chainer.iterators.MultiprocessIterator(train, args.batchsize, True, False, "
        "n_processes=4, shared_mem=2**20)"
    )
    result = convert(source, data="global", scaling="strong", idempotent=True)
    out = result.output
    assert out is not None
    # the workers become reading threads, shared by the ranks of a node
    assert_has_expression(
        out,
        "mn.create_global_batch_iterator(train, args.batchsize, comm, repeat=True, shuffle=False,"
        " n_threads=max(1, 4 // comm.intra_size))",
    )
    # no processes left to fork: no forkserver preamble
    assert_no_expression(out, "multiprocessing.set_start_method(...)")
    dropped = [e for e in result.entries if "not carried" in e.message]
    assert len(dropped) == 1 and "shared_mem" in dropped[0].message
    assert "n_processes" not in dropped[0].message


def test_a_long_global_iterator_call_is_written_one_argument_a_line() -> None:
    source = _script(
        "chainer.iterators.MultithreadIterator(train, args.batchsize, shuffle=True, "
        "n_threads=args.loader_threads)"
    )
    out = convert(source, data="global", scaling="strong", idempotent=True).output
    assert out is not None
    assert_has_expression(
        out,
        "mn.create_global_batch_iterator(train, args.batchsize, comm, shuffle=True, "
        "n_threads=max(1, args.loader_threads // comm.intra_size))",
    )
    lines = [line for line in out.splitlines() if "create_global_batch_iterator" in line]
    assert lines == ["    train_iter = mn.create_global_batch_iterator("]
    assert max(len(line) for line in out.splitlines()) <= 99 or "extend" in max(
        out.splitlines(), key=len
    )


def test_shuffle_none_is_chainers_default_shuffle() -> None:
    out = convert(
        _script("chainer.iterators.SerialIterator(train, args.batchsize, shuffle=None)"),
        data="global",
        scaling="strong",
    ).output
    assert out is not None
    assert_has_expression(out, "mn.create_global_batch_iterator(train, args.batchsize, comm)")


def test_inline_dataset_is_not_scattered() -> None:
    out = convert(
        _script("chainer.iterators.SerialIterator(train[:100], args.batchsize)"), data="global"
    ).output
    assert out is not None
    assert_has_expression(
        out, "mn.create_global_batch_iterator(train[:100], args.batchsize * comm.size, comm)"
    )
    assert_no_expression(out, "mn.scatter_dataset(train[:100], ...)")


def test_what_cannot_become_global_stays_scattered_and_is_reported() -> None:
    source = _script(
        "chainer.iterators.SerialIterator(train, args.batchsize, order_sampler=sampler)",
        "extensions.snapshot(n_retains=2)",
    ).replace("    train_iter =", "    sampler = None\n    train_iter =")
    result = convert(source, data="global")
    out = result.output
    assert out is not None
    assert_has_statement(out, "train = mn.scatter_dataset(train, comm, shuffle=True)")
    assert_no_expression(out, "mn.create_global_batch_iterator(...)")
    people = _people(result)
    assert any("order_sampler" in m and "scatter_dataset" in m for m in people), people
    # nothing global to resume: the per-rank snapshot is left as the scatter run has it
    assert_no_expression(out, "mn.extensions.global_snapshot(...)")


def test_snapshot_with_arguments_global_snapshot_lacks_stays() -> None:
    result = convert(_script(snapshot="extensions.snapshot(n_retains=2)"), data="global")
    assert result.output is not None
    assert_has_expression(result.output, "extensions.snapshot(n_retains=2)")
    assert any("n_retains" in m for m in _people(result))


GROW = {"data": "global", "scaling": "strong", "grow_batch": True}


@pytest.mark.parametrize(
    ("decay", "extend"),
    [
        (
            "trainer.extend(extensions.ExponentialShift('lr', 0.1), trigger=(30, 'epoch'))",
            "trainer.extend(mn.extensions.GrowBatch(10, max_per_rank=args.batchsize), "
            "trigger=(30, 'epoch'))",
        ),
        (
            "trainer.extend(extensions.ExponentialShift('alpha', 1 / 4), "
            "trigger=chainer.training.triggers.ManualScheduleTrigger([10, 20], 'epoch'))",
            "trainer.extend(mn.extensions.GrowBatch(4, max_per_rank=args.batchsize), "
            "trigger=chainer.training.triggers.ManualScheduleTrigger([10, 20], 'epoch'))",
        ),
        (
            "trainer.extend(extensions.StepShift('lr', 0.5, 3), trigger=(1, 'epoch'))",
            "trainer.extend(mn.extensions.GrowBatch(2, max_per_rank=args.batchsize), "
            "trigger=(3, 'epoch'))",
        ),
        (
            "trainer.extend(extensions.MultistepShift('lr', 0.1, [100, 150], 0.1))",
            # 100 iterations at B, then the 50 more of the decay's at 10 B are 5
            "trainer.extend(mn.extensions.GrowBatch(10, max_per_rank=args.batchsize), "
            "trigger=chainer.training.triggers.ManualScheduleTrigger([100, 105], 'iteration'))",
        ),
    ],
)
def test_grow_batch_replaces_decay(decay: str, extend: str) -> None:
    result = convert(_script(decay=decay), idempotent=True, **GROW)
    assert result.output is not None
    assert_has_statement(result.output, extend, within="main")
    replaced = [e for e in result.entries if e.step == "grow-batch" and e.severity == "changed"]
    assert len(replaced) == 1 and "updates per epoch" in replaced[0].message


def test_grow_batch_plain_make_extension() -> None:
    decay = (
        "@training.make_extension(trigger=(5, 'epoch'))\n"
        "    def drop(trainer):\n"
        "        optimizer.lr /= 10\n"
        "    trainer.extend(drop)"
    )
    out = convert(_script(decay=decay), idempotent=True, **GROW).output
    assert out is not None
    assert_has_statement(
        out,
        "trainer.extend(mn.extensions.GrowBatch(10, max_per_rank=args.batchsize, "
        "trigger=(5, 'epoch')))",
        within="main",
    )


@pytest.mark.parametrize(
    ("decay", "why"),
    [
        ("trainer.extend(extensions.ExponentialShift('lr', 0.3), trigger=(1, 'epoch'))", "1/f"),
        (
            "trainer.extend(extensions.ExponentialShift('lr', 0.5), trigger=(1000, 'iteration'))",
            "iterations",
        ),
        (
            "trainer.extend(extensions.ExponentialShift('lr', 0.5, target=1e-4), trigger=(1, 'epoch'))",
            "target",
        ),
        ("trainer.extend(extensions.StepShift('lr', 0.5, 1000))", "iterations"),
        (
            "trainer.extend(extensions.ExponentialShift('momentum', 0.5), trigger=(1, 'epoch'))",
            "momentum",
        ),
    ],
)
def test_grow_batch_leaves_what_it_cannot_match_and_says_why(decay: str, why: str) -> None:
    result = convert(_script(decay=decay), **GROW)
    assert result.output is not None
    assert_no_expression(result.output, "mn.extensions.GrowBatch(...)")
    assert_has_statement(result.output, decay, within="main")
    people = _people(result)
    assert len(people) == 1 and why in people[0], people


def test_grow_batch_needs_global_strong_options() -> None:
    with pytest.raises(ValueError, match="grow_batch"):
        ConvertOptions(grow_batch=True)
    source = _script(
        decay="trainer.extend(extensions.ExponentialShift('lr', 0.1), trigger=(30, 'epoch'))"
    )
    # without --grow-batch a decay stays a decay
    plain = convert_source(source, "train.py", ConvertOptions(data="global"))
    assert plain.output is not None
    assert_no_expression(plain.output, "mn.extensions.GrowBatch(...)")


@pytest.mark.parametrize(
    "flags",
    [
        ["--grow-batch", "--data", "scatter"],
        ["--grow-batch", "--scaling", "weak"],
        ["--data", "global", "--target", "chainermn"],
        ["--data", "global", "--model-parallel", "channel"],
    ],
)
def test_cli_refuses_contradictory_data_flags(flags: list[str], tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_script(), encoding="utf-8")
    result = CliRunner().invoke(main, ["convert", *flags, str(script)])
    assert result.exit_code == 2, result.output


def test_cli_grow_batch_implies_global_strong(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    decay = "trainer.extend(extensions.ExponentialShift('lr', 0.1), trigger=(30, 'epoch'))"
    script.write_text(_script(decay=decay), encoding="utf-8")
    out = tmp_path / "out.py"
    result = CliRunner().invoke(main, ["convert", "--grow-batch", str(script), "-o", str(out)])
    assert result.exit_code == 0, result.output
    batch_line = next(line for line in result.output.splitlines() if line.startswith("batch: "))
    assert batch_line == (
        "batch: args.batchsize global as written, args.batchsize / comm.size per rank (--scaling "
        "strong): epochs and iteration-counted schedules keep their meaning (--data global: any "
        "number of ranks trains like one process with it)"
    )
    code = out.read_text(encoding="utf-8")
    assert_has_expression(code, "mn.create_global_batch_iterator(train, args.batchsize, comm)")
    assert_has_expression(code, "mn.extensions.GrowBatch(10, max_per_rank=args.batchsize)")
    assert_no_statement(code, "train = mn.scatter_dataset(...)")


@pytest.mark.slow
@seed(SKELETON_SEED)
@settings(max_examples=budget(0.3), suppress_health_check=_slow)
@given(skeletons(distributed=False))
def test_generated_scripts_under_grow_batch_keep_every_property(skeleton: Skeleton) -> None:
    """docs/design.md §0 under ``--grow-batch`` (so ``--data global --scaling strong``): the
    generated scripts convert, keep every statement in place, add no collective that only some
    ranks reach, and convert to a fixed point, deterministically."""
    note(skeleton.source)
    check_skeleton(skeleton.source, options=ConvertOptions(**GROW))


def test_transform_dataset_is_built_on_every_rank() -> None:
    """A TransformDataset's transform may not pickle (a lambda): nothing is broadcast, every
    rank builds the training set as written."""
    source = _script().replace(
        "    train_iter =",
        "    train = chainer.datasets.TransformDataset(train, lambda e: e)\n    train_iter =",
    )
    result = convert(source, data="global", idempotent=True)
    out = result.output
    assert out is not None
    assert_no_expression(out, "comm.bcast_obj(train)")
    assert_no_expression(out, "mn.scatter_dataset(train, ...)")
    assert_has_statement(
        out,
        "train, test = chainer.datasets.get_mnist()\n"
        "train = chainer.datasets.TransformDataset(train, lambda e: e)\n"
        "train_iter = mn.create_global_batch_iterator(train, args.batchsize * comm.size, comm)",
        within="main",
        top_level=True,
    )


def test_chainermn_target_keeps_the_scatter_and_says_why() -> None:
    result = convert(_script(), data="global", target="chainermn")
    assert result.output is not None
    assert_has_statement(
        result.output, "train = chainermn.scatter_dataset(train, comm, shuffle=True)"
    )
    assert_no_expression(result.output, "chainermn.create_global_batch_iterator(...)")
    assert any("ChainerMN has no global-batch iterator" in m for m in _people(result))
