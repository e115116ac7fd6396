"""Hand-written evaluation loops (docs/converter.md, MN805): a test set read only by loops that
evaluate is handed whole to every rank (``comm.bcast_obj``), so the value the user's own
arithmetic computes is the one-process value on every rank; any other use keeps the scatter
and goes to a person. The end-to-end test runs a converted script on 2 and 3 ranks and
compares its logged validation accuracy with the whole-set accuracy of the weights it saved."""

from __future__ import annotations

import ast
import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from mnify.converter import FileResult
from tests.convert.converting import convert
from tests.support.mpirun import run_ranks

HEAD = """\
import argparse
import json
import os

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L
from chainer.dataset import concat_examples
"""

DATA = """
def make(n, seed):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 4).astype(np.float32)
    t = (x[:, 0] + x[:, 1] > 1.0).astype(np.int32)
    return chainer.datasets.TupleDataset(x, t)
"""

# A helper of the file that only reads the model: a mean of batch accuracies (batches of 5
# over 27 examples, so a shard's mean is not the whole set's), then reset().
EVALUATE = """
def evaluate(model, iterator):
    accs = []
    with chainer.using_config('train', False), chainer.no_backprop_mode():
        for batch in iterator:
            x, t = concat_examples(batch)
            accs.append(float(F.accuracy(model.predictor(x), t).array))
    iterator.reset()
    return float(np.mean(accs))
"""

EARLY_STOPPING = (
    HEAD
    + DATA
    + EVALUATE
    + """

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--epoch', type=int, default=4)
    parser.add_argument('--batchsize', type=int, default=8)
    parser.add_argument('--out', default='result')
    args = parser.parse_args()

    np.random.seed(0)
    model = L.Classifier(L.Linear(4, 2))
    optimizer = chainer.optimizers.SGD(lr=0.5)
    optimizer.setup(model)

    train = make(48, 0)
    valid = make(27, 1)
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    valid_iter = chainer.iterators.SerialIterator(valid, 5, repeat=False, shuffle=False)

    best, history = -1.0, []
    while train_iter.epoch < args.epoch:
        x, t = concat_examples(train_iter.next())
        optimizer.update(model, x, t)
        if train_iter.is_new_epoch:
            acc = evaluate(model, valid_iter)
            history.append(acc)
            if acc < best:
                break  # early stopping: every rank must take the same branch
            best = acc

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, 'history.json'), 'w') as f:
        json.dump(history, f)
    chainer.serializers.save_npz(os.path.join(args.out, 'model.npz'), model)


if __name__ == '__main__':
    main()
"""
)


def _module_script(body: str) -> str:
    """A module-level script: imports, data, then ``body``."""
    return HEAD + DATA + "\n" + textwrap.dedent(body)


def _bound_to(output: str, func: str) -> list[str]:
    """Names assigned ``<something>.func(name, ...)`` (or ``func(name, ...)``), in order."""
    found = []
    for node in ast.walk(ast.parse(output)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            called = ast.unparse(node.value.func)
            if called == func or called.endswith("." + func):
                arg = node.value.args[0]
                assert isinstance(arg, ast.Name)
                found.append(arg.id)
    return found


def _messages(result: FileResult, severity: str) -> list[str]:
    return [e.message for e in result.entries if e.severity == severity]


def test_an_evaluation_helper_gets_the_whole_test_set_loaded_on_rank_0() -> None:
    result = convert(EARLY_STOPPING, idempotent=True)
    output = result.output or ""
    assert _bound_to(output, "scatter_dataset") == ["train"]
    assert _bound_to(output, "bcast_obj") == ["valid"]
    assert (
        "if comm.rank == 0:\n        valid = make(27, 1)\n    else:\n        valid = None" in output
    )
    assert _messages(result, "needs-person") == []
    assert any("every rank evaluates the whole test set" in m for m in _messages(result, "info"))


def test_an_inline_evaluation_loop_rebuilt_every_epoch_gets_the_whole_test_set() -> None:
    source = _module_script(
        """
        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        train, test = make(40, 0), make(10, 1)
        it = chainer.iterators.SerialIterator(train, 8)
        while it.epoch < 2:
            optimizer.update(model, *concat_examples(it.next()))
            if it.is_new_epoch:
                test_it = chainer.iterators.SerialIterator(test, 4, repeat=False, shuffle=False)
                correct = 0
                for batch in test_it:
                    x, t = concat_examples(batch)
                    correct += int((model.predictor(x).array.argmax(1) == t).sum())
                print('accuracy', correct / len(test))
        """
    )
    result = convert(source, idempotent=True)
    output = result.output or ""
    assert _bound_to(output, "scatter_dataset") == ["train"]
    assert _bound_to(output, "bcast_obj") == ["test"]
    assert _messages(result, "needs-person") == []


def test_a_repeat_false_training_loop_is_scattered_and_not_called_evaluation() -> None:
    source = _module_script(
        """
        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        train = make(40, 0)
        for epoch in range(3):
            epoch_it = chainer.iterators.SerialIterator(train, 8, repeat=False)
            for batch in epoch_it:
                x, t = concat_examples(batch)
                model.cleargrads()
                loss = model(x, t)
                loss.backward()
                optimizer.update()
        """
    )
    result = convert(source)
    output = result.output or ""
    assert _bound_to(output, "scatter_dataset") == ["train"]
    assert _bound_to(output, "bcast_obj") == []
    assert not any(
        "hand-written loop" in m for e in ("info", "needs-person") for m in _messages(result, e)
    )


def test_an_iterator_handed_to_a_library_keeps_the_scatter_and_goes_to_a_person() -> None:
    source = _module_script(
        """
        import mylib

        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        train, test = make(40, 0), make(10, 1)
        it = chainer.iterators.SerialIterator(train, 8)
        test_it = chainer.iterators.SerialIterator(test, 4, repeat=False)
        while it.epoch < 2:
            optimizer.update(model, *concat_examples(it.next()))
            if it.is_new_epoch:
                print(mylib.evaluate(model, test_it))
        """
    )
    result = convert(source)
    output = result.output or ""
    assert _bound_to(output, "scatter_dataset") == ["train", "test"]
    assert _bound_to(output, "bcast_obj") == []
    assert any("sees only this rank's shard" in m for m in _messages(result, "needs-person"))


def test_a_training_set_evaluated_during_training_stays_scattered() -> None:
    """Accuracy over the training set every epoch: the training iterator needs its shard, so
    the evaluation over it sees the shard and goes to a person."""
    source = _module_script(
        """
        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        train = make(40, 0)
        it = chainer.iterators.SerialIterator(train, 8)
        while it.epoch < 2:
            optimizer.update(model, *concat_examples(it.next()))
            if it.is_new_epoch:
                train_eval = chainer.iterators.SerialIterator(train, 8, repeat=False)
                for batch in train_eval:
                    x, t = concat_examples(batch)
                    print(float(F.accuracy(model.predictor(x), t).array))
        """
    )
    result = convert(source, idempotent=True)
    assert _bound_to(result.output or "", "bcast_obj") == []
    assert any("sees only this rank's shard" in m for m in _messages(result, "needs-person"))


def test_a_training_set_evaluated_after_training_is_read_whole_on_rank_0() -> None:
    """The post-training tail runs on rank 0, which keeps the whole dataset: only the training
    iterator gets the shard (before, the tail's iterator was given a scatter under the rank
    check, and the converter's own deadlock check refused the output)."""
    source = _module_script(
        """
        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        train = make(40, 0)
        it = chainer.iterators.SerialIterator(train, 8)
        while it.epoch < 2:
            optimizer.update(model, *concat_examples(it.next()))
        train_eval = chainer.iterators.SerialIterator(train, 8, repeat=False, shuffle=False)
        for batch in train_eval:
            x, t = concat_examples(batch)
            print(float(F.accuracy(model.predictor(x), t).array))
        """
    )
    result = convert(source, idempotent=True)
    module = ast.parse(result.output or "")
    tail = module.body[-1]
    assert isinstance(tail, ast.If) and ast.unparse(tail.test) == "comm.rank == 0"
    assert ast.unparse(tail.body[0]) == (
        "train_eval = chainer.iterators.SerialIterator(train, 8, repeat=False, shuffle=False)"
    )
    assert "SerialIterator(mn.scatter_dataset(train, comm, shuffle=True), 8)" in (
        result.output or ""
    )
    assert _messages(result, "needs-person") == []


def test_a_helper_that_updates_is_training_not_evaluation() -> None:
    source = _module_script(
        """
        def run_epoch(model, optimizer, iterator):
            for batch in iterator:
                optimizer.update(model, *concat_examples(batch))

        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        train = make(40, 0)
        for epoch in range(2):
            run_epoch(model, optimizer, chainer.iterators.SerialIterator(train, 8, repeat=False))
        epoch_it = chainer.iterators.SerialIterator(train, 8, repeat=False)
        run_epoch(model, optimizer, epoch_it)
        """
    )
    result = convert(source)
    assert _bound_to(result.output or "", "bcast_obj") == []


def _load_script(path: Path) -> object:
    spec = importlib.util.spec_from_file_location("hand_evaluation_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_converted_evaluation_is_the_whole_set_value(ranks: int, tmp_path: Path) -> None:
    """The accuracy the converted script logs is the whole validation set's accuracy of the
    weights rank 0 saved, computed here in one process by the script's own evaluate()."""
    import chainer
    import chainer.links as L

    result = convert(EARLY_STOPPING)
    script = tmp_path / "train.py"
    script.write_text(result.output or "", encoding="utf-8")
    run_ranks(ranks, script, ["--out", "result"], cwd=tmp_path, timeout=150)
    history = json.loads((tmp_path / "result" / "history.json").read_text())
    assert history, "no evaluation ran"
    module = _load_script(tmp_path / "original.py")
    model = L.Classifier(L.Linear(4, 2))
    chainer.serializers.load_npz(tmp_path / "result" / "model.npz", model)
    valid = module.make(27, 1)  # type: ignore[attr-defined]
    expected = module.evaluate(  # type: ignore[attr-defined]
        model, chainer.iterators.SerialIterator(valid, 5, repeat=False, shuffle=False)
    )
    assert history[-1] == expected


@pytest.fixture(autouse=True)
def _original(tmp_path: Path) -> None:
    """The unconverted script next to the converted one, for its make() and evaluate()."""
    (tmp_path / "original.py").write_text(EARLY_STOPPING, encoding="utf-8")
