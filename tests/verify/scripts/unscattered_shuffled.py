"""Wrong: converted halfway. The optimizer is multi-node but the dataset is not scattered, and
each rank's iterator shuffles it in its own random order (numpy's global RNG, seeded by the OS)."""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training
from chainer.training import extensions

from mnify import runtime as mn


class MLP(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_out)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def load_data(n=6000):
    rng = np.random.RandomState(42)
    x = rng.rand(n, 20).astype(np.float32)
    t = (x[:, 0] * 10).astype(np.int32)
    return chainer.datasets.TupleDataset(x, t)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batchsize", "-b", type=int, default=32)
    parser.add_argument("--epoch", "-e", type=int, default=2)
    parser.add_argument("--out", "-o", default="result")
    args = parser.parse_args()

    comm = mn.create_communicator("naive")
    model = L.Classifier(MLP(50, 10))
    optimizer = mn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
    optimizer.setup(model)

    train = load_data()  # every rank: the whole dataset
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (args.epoch, "epoch"), out=args.out)
    if comm.rank == 0:
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.PrintReport(["epoch", "main/loss", "main/accuracy"]))
    trainer.run()


if __name__ == "__main__":
    main()
