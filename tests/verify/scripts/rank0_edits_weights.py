"""Wrong: a weight-clipping extension runs on rank 0 only, so rank 0's weights drift from the
others' (it was put under `if comm.rank == 0` with the reporting extensions)."""

import argparse

import chainer
import chainer.links as L
import numpy as np
from chainer import training
from chainer.training import extensions

from mnify import runtime as mn


@training.make_extension(trigger=(1, "iteration"))
def clip_weights(trainer):
    model = trainer.updater.get_optimizer("main").target
    for param in model.params():
        np.clip(param.array, -0.05, 0.05, out=param.array)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batchsize", type=int, default=8)
    args = parser.parse_args()
    comm = mn.create_communicator("naive")
    train = None
    if comm.rank == 0:
        x = np.random.RandomState(0).rand(200, 6).astype(np.float32)
        train = chainer.datasets.TupleDataset(x, (x[:, 0] > 0.5).astype(np.int32))
    train = mn.scatter_dataset(train, comm)
    model = L.Classifier(L.Linear(6, 2))
    optimizer = mn.create_multi_node_optimizer(chainer.optimizers.SGD(0.5), comm)
    optimizer.setup(model)
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    trainer = training.Trainer(
        training.updaters.StandardUpdater(train_iter, optimizer), (5, "epoch"), out="result"
    )
    if comm.rank == 0:
        trainer.extend(clip_weights)
        trainer.extend(extensions.LogReport())
    trainer.run()


if __name__ == "__main__":
    main()
