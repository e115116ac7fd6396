#!/usr/bin/env python
"""Single-GPU Chainer MNIST example (the input `mnify convert` is demonstrated on).

Run it as is: `python train_mnist.py --device -1 --synthetic 256 --epoch 2` (CPU, tiny random
data) or `--device 0` on a GPU with real MNIST. `bash scripts/demo.sh` converts it and runs the
result on 2 ranks.
"""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training
from chainer.training import extensions


class MLP(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            # sizes given up front: the weights are drawn right after seeding
            self.l1 = L.Linear(784, n_units)  # n_in -> n_units
            self.l2 = L.Linear(n_units, n_units)  # n_units -> n_units
            self.l3 = L.Linear(n_units, n_out)  # n_units -> n_out

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def synthetic_mnist(n_train, n_test, seed=0):
    """Tiny random stand-in for MNIST: 784 features, 10 classes."""
    rng = np.random.RandomState(seed)

    def make(n):
        x = rng.rand(n, 784).astype(chainer.get_dtype())  # CHAINER_DTYPE=float64 runs too
        t = rng.randint(0, 10, size=n).astype(np.int32)
        return chainer.datasets.TupleDataset(x, t)

    return make(n_train), make(n_test)


def main():
    parser = argparse.ArgumentParser(description="Chainer example: MNIST")
    parser.add_argument(
        "--batchsize", "-b", type=int, default=100, help="Number of images in each mini-batch"
    )
    parser.add_argument(
        "--epoch", "-e", type=int, default=20, help="Number of sweeps over the dataset to train"
    )
    parser.add_argument(
        "--frequency", "-f", type=int, default=-1, help="Frequency of taking a snapshot"
    )
    parser.add_argument(
        "--device",
        "-d",
        type=str,
        default="-1",
        help="Device specifier: -1 for CPU, 0 or @cupy:0 for GPU 0",
    )
    parser.add_argument("--out", "-o", default="result", help="Directory to output the result")
    parser.add_argument("--resume", "-r", type=str, help="Resume the training from snapshot")
    parser.add_argument("--unit", "-u", type=int, default=1000, help="Number of units")
    parser.add_argument("--seed", type=int, default=0, help="Random seed")
    parser.add_argument(
        "--synthetic",
        type=int,
        default=0,
        help="Use N random examples instead of MNIST (0: real MNIST)",
    )
    parser.add_argument(
        "--noplot", dest="plot", action="store_false", help="Disable PlotReport extension"
    )
    args = parser.parse_args()

    device = chainer.get_device(args.device)

    print(f"Device: {device}")
    print(f"# unit: {args.unit}")
    print(f"# Minibatch-size: {args.batchsize}")
    print(f"# epoch: {args.epoch}")
    print("")

    np.random.seed(args.seed)
    # Set up a neural network to train
    model = L.Classifier(MLP(args.unit, 10))
    model.to_device(device)
    device.use()

    # Setup an optimizer
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    # Load the MNIST dataset
    if args.synthetic:
        train, test = synthetic_mnist(args.synthetic, args.synthetic)
    else:
        train, test = chainer.datasets.get_mnist()

    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)

    # Set up a trainer
    updater = training.updaters.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, "epoch"), out=args.out)

    # Evaluate the model with the test dataset for each epoch
    trainer.extend(extensions.Evaluator(test_iter, model, device=device))

    # Dump a computational graph from 'loss' variable at the first iteration
    trainer.extend(extensions.DumpGraph("main/loss"))

    # Take a snapshot for each specified epoch
    frequency = args.epoch if args.frequency == -1 else max(1, args.frequency)
    trainer.extend(extensions.snapshot(), trigger=(frequency, "epoch"))

    # Write a log of evaluation statistics for each epoch
    trainer.extend(extensions.LogReport())

    # Save two plot images to the result dir
    if args.plot and extensions.PlotReport.available():
        trainer.extend(
            extensions.PlotReport(
                ["main/loss", "validation/main/loss"], "epoch", file_name="loss.png"
            )
        )
        trainer.extend(
            extensions.PlotReport(
                ["main/accuracy", "validation/main/accuracy"], "epoch", file_name="accuracy.png"
            )
        )

    trainer.extend(
        extensions.PrintReport(
            [
                "epoch",
                "main/loss",
                "validation/main/loss",
                "main/accuracy",
                "validation/main/accuracy",
                "elapsed_time",
            ]
        )
    )

    trainer.extend(extensions.ProgressBar())

    if args.resume is not None:
        # Resume from a snapshot
        chainer.serializers.load_npz(args.resume, trainer)

    trainer.run()


if __name__ == "__main__":
    main()
