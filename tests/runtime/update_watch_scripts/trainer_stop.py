"""A Trainer script (argparse, extensions) that asks update_watch to stop after --stop updates.

Each rank prints ``RESULT {json}`` from an atexit handler: how many updates its optimizer made,
whether the Trainer's finally (extension finalize) ran, and what the observer saw.
"""

import argparse
import atexit
import json

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training

from mnify import runtime as mn
from mnify.runtime import update_watch


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(4, 8)
            self.l2 = L.Linear(8, 3)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


class Finalized(training.Extension):
    trigger = (1, "iteration")
    finalized = False

    def __call__(self, trainer):
        pass

    def finalize(self):
        Finalized.finalized = True


class Seen:
    def __init__(self):
        self.before, self.after = [], []

    def before_update(self, optimizer, index):
        self.before.append(index)

    def after_update(self, optimizer, index):
        self.after.append((type(optimizer).__name__, index))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop", type=int, default=3)
    parser.add_argument("--epoch", type=int, default=20)
    args = parser.parse_args()
    comm = mn.create_communicator("naive")
    rng = np.random.RandomState(0)
    x = rng.rand(64, 4).astype(np.float32)
    t = rng.randint(0, 3, 64).astype(np.int32)
    train = mn.scatter_dataset(chainer.datasets.TupleDataset(x, t), comm, shuffle=True)
    model = L.Classifier(Net())
    opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(0.1), comm)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(train, 4)
    updater = training.updaters.StandardUpdater(it, opt)
    trainer = training.Trainer(updater, (args.epoch, "epoch"), out="result")
    trainer.extend(Finalized())
    trainer.extend(training.extensions.LogReport(trigger=(1, "iteration")))
    seen = Seen()
    update_watch.watch_updates(seen)
    update_watch.stop_after_updates(args.stop, "test")

    def report():
        print(
            "RESULT "
            + json.dumps(
                {
                    "rank": comm.rank,
                    "t": opt.t,
                    "iteration": updater.iteration,
                    "finalized": Finalized.finalized,
                    "before": seen.before,
                    "after": seen.after,
                }
            ),
            flush=True,
        )

    atexit.register(report)
    trainer.run()
    print("NOT STOPPED", flush=True)


if __name__ == "__main__":
    main()
