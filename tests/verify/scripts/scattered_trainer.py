"""Right: ChainerMN style. The dataset is scattered (force_equal_length repeats at most size - 1
examples), the optimizer is multi-node, only rank 0 reports and writes."""

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
        return self.l2(F.dropout(F.relu(self.l1(x)), 0.3))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batchsize", "-b", type=int, default=16)
    parser.add_argument("--epoch", "-e", type=int, default=3)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--out", "-o", default="result")
    args = parser.parse_args()

    comm = mn.create_communicator("naive")
    model = L.Classifier(MLP(50, 10))
    optimizer = mn.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(0.05), comm)
    optimizer.setup(model)

    if comm.rank == 0:
        rng = np.random.RandomState(0)
        x = rng.rand(args.examples, 20).astype(np.float32)
        t = (x[:, 0] * 10).astype(np.int32)
        train = chainer.datasets.TupleDataset(x, t)
    else:
        train = None
    train = mn.scatter_dataset(train, comm, shuffle=True)
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (args.epoch, "epoch"), out=args.out)
    if comm.rank == 0:
        trainer.extend(extensions.LogReport(trigger=(1, "iteration")))
        trainer.extend(extensions.snapshot(), trigger=(1, "epoch"))
    trainer.run()


if __name__ == "__main__":
    main()
