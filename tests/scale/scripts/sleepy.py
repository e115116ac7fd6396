"""A data-parallel training script whose costs are known, for ``mnify scale``'s tests.

    sleepy.py [--trainer] [--compute-ms MS] [--slow-rank R --slow-ms MS] [--slow-extra-ms MS]
              [--rank0-ms MS] [--wide UNITS] [--load-ms MS] [--unsplit] [--batch B] [--epochs E]

Compute is modelled by sleeping inside the model's forward (so the figures hold on a loaded
machine): ``--compute-ms`` every rank, ``--slow-ms`` more on rank ``--slow-rank`` (and
``--slow-extra-ms`` more before a second collective of the step, the issue's 1.5 s + 0.3 s
case); ``--rank0-ms`` is work rank 0 alone does every iteration, under ``if comm.rank == 0``;
``--wide`` makes a model of UNITS x UNITS weights with no sleep (gradient averaging dominates);
``--load-ms`` sleeps in each example's loading; ``--unsplit`` gives every rank the whole
dataset. ``--trainer`` trains with a Trainer (a rank-0-only extension when ``--rank0-ms``),
else with a hand-written loop.
"""

from __future__ import annotations

import argparse
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training

from mnify import runtime as mn


class Examples(chainer.dataset.DatasetMixin):
    def __init__(self, n: int, width: int, load_ms: float) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, width)).astype(np.float32)
        self.t = rng.integers(0, 4, n).astype(np.int32)
        self.load_ms = load_ms

    def __len__(self) -> int:
        return len(self.x)

    def get_example(self, i: int) -> tuple[np.ndarray, np.int32]:
        if self.load_ms:
            time.sleep(self.load_ms / 1e3)
        return self.x[i], self.t[i]


class Sleepy(chainer.Chain):
    def __init__(self, width: int, units: int, rank: int, args: argparse.Namespace) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(width, units)
            self.l2 = L.Linear(units, 4)
        self.rank, self.args = rank, args
        self.comm: mn.CommunicatorBase | None = None

    def forward(self, x: chainer.Variable, t: np.ndarray) -> chainer.Variable:
        a = self.args
        sleep = a.compute_ms + (a.slow_ms if self.rank == a.slow_rank else 0.0)
        time.sleep(sleep / 1e3)
        if a.slow_extra_ms and self.comm is not None:
            # a second collective in the step (as synchronised BatchNorm adds), late again
            self.comm.allreduce_obj(0)
            if self.rank == a.slow_rank:
                time.sleep(a.slow_extra_ms / 1e3)
            self.comm.allreduce_obj(0)
        return F.softmax_cross_entropy(self.l2(F.relu(self.l1(x))), t)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trainer", action="store_true")
    p.add_argument("--compute-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-extra-ms", type=float, default=0.0)
    p.add_argument("--rank0-ms", type=float, default=0.0)
    p.add_argument("--wide", type=int, default=0)
    p.add_argument("--load-ms", type=float, default=0.0)
    p.add_argument("--unsplit", action="store_true")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1000)
    args = p.parse_args()

    comm = mn.create_communicator("flat")
    width = args.wide or 16
    model = Sleepy(width, args.wide or 16, comm.rank, args)
    model.comm = comm
    optimizer = mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
    optimizer.setup(model)
    dataset = Examples(64 * comm.size, width, args.load_ms)
    if not args.unsplit:
        dataset = mn.scatter_dataset(dataset, comm, shuffle=True)
    it = chainer.iterators.SerialIterator(dataset, args.batch)
    if args.trainer:
        updater = training.StandardUpdater(it, optimizer, loss_func=model)
        trainer = training.Trainer(updater, (args.epochs, "epoch"))
        if comm.rank == 0 and args.rank0_ms:

            @training.make_extension(trigger=(1, "iteration"))
            def slow_report(trainer: training.Trainer) -> None:
                time.sleep(args.rank0_ms / 1e3)

            trainer.extend(slow_report)
        trainer.run()
        return
    for _ in range(args.epochs * (len(dataset) // args.batch)):
        x, t = chainer.dataset.concat_examples(it.next())
        optimizer.update(model, x, t)
        if comm.rank == 0:
            time.sleep(args.rank0_ms / 1e3)  # a plot, a log line, a snapshot


if __name__ == "__main__":
    main()
