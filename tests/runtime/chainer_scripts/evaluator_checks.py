"""Rank script: the multi-node evaluator reports means over all examples, even with uneven shards.

The reference is one process evaluating the whole test set in a single batch (so its mean is
the exact per-example mean). Shards are scattered with ``force_equal_length=False`` so ranks hold
different numbers of examples; ChainerMN's unweighted mean of rank means would be off.
"""

from __future__ import annotations

from typing import Any

import chainer
import chainer.links as L
import numpy as np
from chainer.training import extensions
from script_support import assert_close, make_comm, report

from mnify.runtime.datasets.scatter_dataset import scatter_dataset
from mnify.runtime.extensions.multi_node_evaluator import create_multi_node_evaluator

chainer.global_config.dtype = np.dtype(np.float64)
comm = make_comm()
rank, size = comm.rank, comm.size


def make_model() -> chainer.Link:
    np.random.seed(0)  # the same model on every rank
    return L.Classifier(L.Linear(4, 3))


def make_data(n: int) -> chainer.datasets.TupleDataset:
    rng = np.random.RandomState(n)
    return chainer.datasets.TupleDataset(rng.randn(n, 4), rng.randint(0, 3, n).astype(np.int32))


def reference(model: chainer.Link, data: Any) -> dict[str, float]:
    it = chainer.iterators.SerialIterator(data, len(data), repeat=False, shuffle=False)
    return {k: float(v) for k, v in extensions.Evaluator(it, model)().items()}


def evaluate_on_ranks(model: chainer.Link, n: int, batch: int, evaluator_class: Any) -> Any:
    shard = scatter_dataset(make_data(n) if rank == 0 else None, comm, force_equal_length=False)
    it = chainer.iterators.SerialIterator(shard, batch, repeat=False, shuffle=False)
    evaluator = create_multi_node_evaluator(evaluator_class(it, model), comm)
    return evaluator(), shard, evaluator


def check(n: int, batch: int, evaluator_class: Any = extensions.Evaluator) -> None:
    model = make_model()
    expected = reference(model, make_data(n))
    got, shard, evaluator = evaluate_on_ranks(model, n, batch, evaluator_class)
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for key in expected:
        assert_close(got[key], expected[key], f"n={n} batch={batch} {key}", rtol=1e-10)
    # evaluating again gives the same (the iterator is restored and reset)
    again = evaluator()
    for key in expected:
        assert_close(again[key], got[key], f"second evaluation {key}", rtol=1e-12)
    # the test is sensitive: ChainerMN's unweighted mean of rank means misses here
    local = reference(model, shard) if len(shard) else {}
    everyone = comm.allgather_obj((len(shard), local))
    if len({length for length, _ in everyone}) > 1 and all(length > 0 for length, _ in everyone):
        unweighted = np.mean([means["main/loss"] for _, means in everyone])
        assert abs(unweighted - expected["main/loss"]) > 1e-9, "shards too alike to tell"


check(11, 64)  # uneven shards, one batch each
check(11, 2)  # uneven shards and short last batches
report(comm, "weighted by examples: uneven shards and short batches match one process")

check(2, 4)  # fewer examples than ranks: some ranks evaluate nothing
report(comm, "ranks with empty shards")


class ManualEvaluator(extensions.Evaluator):  # type: ignore[misc]
    """Overrides evaluate without eval_func: weighted by the examples drawn from the iterator."""

    def evaluate(self) -> dict[str, Any]:
        it = self.get_iterator("main")
        it.reset()
        model = self.get_target("main")
        total, count = 0.0, 0
        for batch in it:
            x, t = chainer.dataset.concat_examples(batch)
            with chainer.no_backprop_mode():
                total += float(model(x, t).array) * len(batch)
            count += len(batch)
        return {"main/loss": total / count} if count else {}


model = make_model()
expected_loss = reference(model, make_data(13))["main/loss"]
got, _, _ = evaluate_on_ranks(model, 13, 3, ManualEvaluator)
assert_close(got["main/loss"], expected_loss, "custom evaluate", rtol=1e-10)
report(comm, "custom evaluate weighted by iterator counts")


def check_in_trainer() -> None:
    """As the converter emits it: extended to a trainer on every rank, reported under its name."""
    model = make_model()
    train = scatter_dataset(make_data(8) if rank == 0 else None, comm)
    test = scatter_dataset(make_data(11) if rank == 0 else None, comm, force_equal_length=False)
    optimizer = chainer.optimizers.SGD(lr=0.0)
    optimizer.setup(model)
    updater = chainer.training.StandardUpdater(
        chainer.iterators.SerialIterator(train, 2), optimizer
    )
    trainer = chainer.training.Trainer(updater, (1, "iteration"), out="/tmp/mnify-eval-test")
    test_it = chainer.iterators.SerialIterator(test, 4, repeat=False, shuffle=False)
    trainer.extend(
        create_multi_node_evaluator(extensions.Evaluator(test_it, model), comm),
        trigger=(1, "iteration"),
    )
    seen: dict[str, float] = {}

    @chainer.training.make_extension(trigger=(1, "iteration"), priority=-100)
    def capture(trainer: Any) -> None:
        seen.update(
            {k: float(v) for k, v in trainer.observation.items() if k.startswith("validation/")}
        )

    trainer.extend(capture)
    trainer.run()
    expected = reference(model, make_data(11))
    assert_close(seen["validation/main/loss"], expected["main/loss"], "trainer loss", 1e-10)
    assert_close(seen["validation/main/accuracy"], expected["main/accuracy"], "accuracy", 1e-10)


check_in_trainer()
report(comm, "inside a trainer, reported as validation/main/*")
