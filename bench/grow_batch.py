"""Growing the batch against decaying the learning rate: same epochs, final loss, updates taken.

    python bench/grow_batch.py [--seeds 3] [--epochs 12] [--every 4]

A statistical check of Smith et al.'s claim on a small synthetic problem (issue 33; not a test:
its figures vary with the seed). A fixed random teacher network labels 4096 Gaussian inputs (20
features, 5 classes, 10% of the labels flipped); a student MLP trains with MomentumSGD for the
same epochs under two schedules:

- ``decay``: Chainer's ``ExponentialShift("lr", 0.5)`` every ``--every`` epochs, batch 32;
- ``grow``: ``mn.extensions.GrowBatch(2)`` at the same triggers, the learning rate unchanged,
  the batch doubling instead (the global-batch iterator on a one-rank communicator).

Both start from the same weights and see the same per-epoch orders. Printed per seed and on
average: the final training loss and held-out accuracy of each, and the updates each took (the
gradient all-reduces a data-parallel run makes). Run it alone, one process, no mpiexec.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn
from mnify.runtime.iterators.global_batch_iterator import epoch_order

N_TRAIN, N_TEST, FEATURES, CLASSES, BATCH, LR = 4096, 1024, 20, 5, 32, 0.1


def make_problem(seed: int) -> tuple[Any, Any]:
    rng = np.random.RandomState(seed)
    w1, w2 = rng.randn(FEATURES, 32), rng.randn(32, CLASSES)
    x = rng.randn(N_TRAIN + N_TEST, FEATURES).astype(np.float32)
    t = np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int32)
    flip = rng.rand(len(t)) < 0.1
    t[flip] = rng.randint(0, CLASSES, int(flip.sum()))
    train = chainer.datasets.TupleDataset(x[:N_TRAIN], t[:N_TRAIN])
    test = chainer.datasets.TupleDataset(x[N_TRAIN:], t[N_TRAIN:])
    return train, test


def make_model(seed: int) -> chainer.Link:
    np.random.seed(seed)
    return L.Classifier(
        chainer.Sequential(
            L.Linear(FEATURES, 64), F.relu, L.Linear(64, 64), F.relu, L.Linear(64, CLASSES)
        )
    )


class EpochSampler:
    def __init__(self, seed: int) -> None:
        self.seed, self.calls = seed, 0

    def __call__(self, order: Any, position: int) -> np.ndarray:
        order = epoch_order(self.seed, self.calls, N_TRAIN)
        self.calls += 1
        return order


def evaluate(model: chainer.Link, data: Any) -> tuple[float, float]:
    x, t = chainer.dataset.concat_examples(data)
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        y = model.predictor(x)
        return float(F.softmax_cross_entropy(y, t).array), float(F.accuracy(y, t).array)


def train(schedule: str, seed: int, epochs: int, every: int, comm: Any) -> dict[str, float]:
    data, test = make_problem(seed)
    model = make_model(seed + 1)
    plain = chainer.optimizers.MomentumSGD(lr=LR)
    if schedule == "decay":
        optimizer = plain
        iterator: Any = chainer.iterators.SerialIterator(
            data, BATCH, order_sampler=EpochSampler(seed)
        )
    else:
        optimizer = mn.create_multi_node_optimizer(plain, comm)
        iterator = mn.create_global_batch_iterator(data, BATCH, comm, seed=seed)
    optimizer.setup(model)
    updater = chainer.training.StandardUpdater(iterator, optimizer)
    trainer = chainer.training.Trainer(updater, (epochs, "epoch"), out="/tmp/mnify-bench-grow")
    if schedule == "decay":
        trainer.extend(
            chainer.training.extensions.ExponentialShift("lr", 0.5), trigger=(every, "epoch")
        )
    else:
        trainer.extend(mn.extensions.GrowBatch(2, (every, "epoch")))
    trainer.run()
    train_loss, _ = evaluate(model, data)
    _, test_accuracy = evaluate(model, test)
    return {"loss": train_loss, "accuracy": test_accuracy, "updates": float(updater.iteration)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--every", type=int, default=4)
    args = p.parse_args()
    comm = mn.create_communicator("naive")
    rows: dict[str, list[dict[str, float]]] = {"decay": [], "grow": []}
    print(f"{'seed':>4} {'schedule':>8} {'train loss':>11} {'test acc':>9} {'updates':>8}")
    for seed in range(args.seeds):
        for schedule in ("decay", "grow"):
            r = train(schedule, seed, args.epochs, args.every, comm)
            rows[schedule].append(r)
            print(
                f"{seed:>4} {schedule:>8} {r['loss']:>11.4f} {r['accuracy']:>9.4f} "
                f"{int(r['updates']):>8}"
            )
    for schedule, found in rows.items():
        loss = statistics.fmean(r["loss"] for r in found)
        accuracy = statistics.fmean(r["accuracy"] for r in found)
        updates = statistics.fmean(r["updates"] for r in found)
        print(f"mean {schedule:>8} {loss:>11.4f} {accuracy:>9.4f} {updates:>8.0f}")
    ratio = statistics.fmean(r["updates"] for r in rows["grow"]) / statistics.fmean(
        r["updates"] for r in rows["decay"]
    )
    print(f"grow/decay updates (and gradient all-reduces): {ratio:.3f}")


if __name__ == "__main__":
    main()
