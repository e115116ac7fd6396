"""Wrong: every rank appends its loss to the same log file (and saves the same model file)."""

import argparse
import os

import chainer
import chainer.links as L
import numpy as np

from mnify import runtime as mn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", default="train.log")
    parser.add_argument("--out", default="model.npz")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    comm = mn.create_communicator("naive")
    x = np.random.RandomState(3).rand(300, 8).astype(np.float32)
    t = (x.sum(axis=1) > 4).astype(np.int32)
    x, t = x[comm.rank :: comm.size], t[comm.rank :: comm.size]
    model = L.Classifier(L.Linear(8, 2))
    opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(0.1), comm)
    opt.setup(model)
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    for i in range(args.iterations):
        batch = slice((i * 10) % len(x), (i * 10) % len(x) + 10)
        opt.update(model, x[batch], t[batch])
        with open(args.log, "a") as log:
            log.write(f"{i} {float(model.loss.array):.5f}\n")
        chainer.serializers.save_npz(args.out, model)


if __name__ == "__main__":
    main()
