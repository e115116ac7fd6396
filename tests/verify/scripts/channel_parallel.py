"""Model-parallel by design: the convolutions split their output channels over the ranks, rank
0's iterator feeds every rank the same batches, and each rank's optimizer updates its own
share (a plain Chainer optimizer, as `mnify convert --model-parallel channel` writes it)."""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training

from mnify import runtime as mn


class SmallCNN(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(1, 8, 3, pad=1)
            self.conv2 = L.Convolution2D(8, 8, 3, pad=1)
            self.fc = L.Linear(8 * 8 * 8, 4)

    def forward(self, x):
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        return self.fc(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batchsize", type=int, default=8)
    args = parser.parse_args()
    comm = mn.create_communicator("naive")
    np.random.set_state(comm.bcast_obj(np.random.get_state()))
    model = L.Classifier(mn.links.create_channel_parallel_model(SmallCNN(), comm))
    optimizer = chainer.optimizers.MomentumSGD(0.01)
    optimizer.setup(model)
    train_iter = None
    if comm.rank == 0:
        rng = np.random.RandomState(0)
        x = rng.rand(64, 1, 8, 8).astype(np.float32)
        train = chainer.datasets.TupleDataset(x, rng.randint(0, 4, 64).astype(np.int32))
        train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    train_iter = mn.create_multi_node_iterator(train_iter, comm)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    training.Trainer(updater, (2, "epoch"), out="result").run()


if __name__ == "__main__":
    main()
