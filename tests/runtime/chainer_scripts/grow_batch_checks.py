"""Rank script (2 ranks): GrowBatch trains like one process that grows its batch alike.

Cases, each against one process running Chainer's SerialIterator with the same epoch orders and
an extension that multiplies its batch (or divides its learning rate) at the same triggers:

- ``grow``: global batch 4, doubled after epoch 1 (24 examples: 6 updates an epoch, then 3);
- ``accumulate``: the same with ``max_per_rank=1``: every share above one example runs as
  micro-batches (2, then 4 per step) before one gradient all-reduce;
- ``hybrid``: ``max_batch=8``: the second trigger divides the learning rate instead.

The model has no batch statistics (Linear -> relu -> Linear, float64, MomentumSGD), so every
case is exact. Each rank writes ``<case>.r<rank>.json``: the largest relative parameter
difference from one process, the per-step micro-batch counts, the gradient all-reduces
(``multi_node_mean_grad`` collectives, counted by an observer) per epoch, the final global
batch and learning rate.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn
from mnify.runtime import observers
from mnify.runtime.iterators.global_batch_iterator import epoch_order
from tests.support.rank_checks import make_comm, passed

chainer.global_config.dtype = np.dtype(np.float64)
comm = make_comm()
assert comm.size == 2, "this script needs 2 ranks"
OUT = os.getcwd()
N, BATCH, EPOCHS, SEED = 24, 4, 3, 3


def make_data() -> chainer.datasets.TupleDataset:
    rng = np.random.RandomState(7)
    return chainer.datasets.TupleDataset(rng.randn(N, 5), rng.randint(0, 3, N).astype(np.int32))


def make_model() -> chainer.Link:
    np.random.seed(11)
    return L.Classifier(chainer.Sequential(L.Linear(5, 7), F.relu, L.Linear(7, 3)))


class EpochSampler:
    """Its k-th call gives epoch k's permutation, as the global-batch iterator draws it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, order: Any, position: int) -> np.ndarray:
        order = epoch_order(SEED, self.calls, N)
        self.calls += 1
        return order


def reference(max_batch: int | None) -> dict[str, np.ndarray]:
    """One process: its batch doubled at each epoch end, or its rate halved past max_batch."""
    model = make_model()
    opt = chainer.optimizers.MomentumSGD(lr=0.05, momentum=0.9)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(make_data(), BATCH, order_sampler=EpochSampler())
    trainer = chainer.training.Trainer(
        chainer.training.StandardUpdater(it, opt), (EPOCHS, "epoch"), out=OUT
    )

    @chainer.training.make_extension(trigger=(1, "epoch"))
    def grow(trainer: Any) -> None:
        if max_batch is not None and it.batch_size * 2 > max_batch:
            opt.lr /= 2
        else:
            it.batch_size *= 2

    trainer.extend(grow)
    trainer.run()
    return {name: np.array(p.array) for name, p in model.namedparams()}


class MeanGradCounter(observers.Observer):
    def __init__(self) -> None:
        self.count = 0

    def collective_enters(self, comm: Any, kind: str, *rest: Any) -> None:
        if kind == "multi_node_mean_grad":
            self.count += 1


def run(case: str, max_batch: int | None, max_per_rank: int | None) -> None:
    model = make_model()
    np.random.seed(100 + comm.rank)  # nothing else may differ: parameters come from rank 0
    opt = mn.create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.05, momentum=0.9), comm
    )
    opt.setup(model)
    it = mn.create_global_batch_iterator(make_data(), BATCH, comm, seed=SEED)
    trainer = chainer.training.Trainer(
        chainer.training.StandardUpdater(it, opt), (EPOCHS, "epoch"), out=OUT
    )
    grow = mn.extensions.GrowBatch(2, (1, "epoch"), max_batch=max_batch, max_per_rank=max_per_rank)
    trainer.extend(grow)
    counter = MeanGradCounter()
    per_epoch: dict[int, int] = defaultdict(int)
    micro: list[int] = []
    seen = [0]

    @chainer.training.make_extension(trigger=(1, "iteration"), priority=-100)
    def count(trainer: Any) -> None:
        epoch = int(it.previous_epoch_detail)  # the epoch this update's batch came from
        per_epoch[epoch] += counter.count - seen[0]
        seen[0] = counter.count
        micro.append(grow.accumulation.micro_batches if grow.accumulation else 1)

    trainer.extend(count)
    unsubscribe = observers.subscribe(counter)
    try:
        trainer.run()
    finally:
        unsubscribe()
    expected = reference(max_batch)
    worst = 0.0
    for name, p in model.namedparams():
        scale = max(float(np.max(np.abs(expected[name]))), 1e-300)
        worst = max(worst, float(np.max(np.abs(p.array - expected[name]))) / scale)
    result = {
        "max_rel_diff": worst,
        "allreduces_per_epoch": [per_epoch[e] for e in range(EPOCHS)],
        "micro_batches": micro,
        "final_batch": it.batch_size,
        "lr": opt.lr,
        "grown": grow.grown,
        "lr_divided": grow.lr_divided,
    }
    with open(os.path.join(OUT, f"{case}.r{comm.rank}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


run("grow", None, None)
run("accumulate", None, 1)
run("hybrid", 8, None)
passed("grow_batch", comm)
