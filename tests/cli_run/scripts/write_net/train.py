"""A data-parallel training script whose post-training writes are not guarded: the write net's case.

Rank 0 keeps the Trainer's log and snapshot (as the converter makes them). After training every
rank saves the model's structure through a method of nets.py (the same file on both ranks) and a
run record named after its process (a file of its own, beside rank 0's). With ``--guard`` both
are rank 0's. Every rank also writes what the net must let pass: a file named for its rank
(two ways), a temporary file inside the output directory, ``/dev/null``.
"""

import argparse
import json
import os
import tempfile

import chainer
import numpy as np
from chainer import training
from chainer.training import extensions
from nets import MLP

from mnify import runtime as mn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="result")
    parser.add_argument("--guard", action="store_true")
    args = parser.parse_args()
    comm = mn.create_communicator("naive")
    model = chainer.links.Classifier(MLP(16, 4))
    optimizer = mn.create_multi_node_optimizer(chainer.optimizers.SGD(0.1), comm)
    optimizer.setup(model)
    train = None
    if comm.rank == 0:
        rng = np.random.RandomState(0)
        x = rng.rand(64, 8).astype(np.float32)
        train = chainer.datasets.TupleDataset(x, rng.randint(0, 4, 64).astype(np.int32))
    train = mn.scatter_dataset(train, comm, shuffle=True)
    updater = training.updaters.StandardUpdater(
        chainer.iterators.SerialIterator(train, 8), optimizer
    )
    trainer = training.Trainer(updater, (2, "epoch"), out=args.out)
    if comm.rank == 0:
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.snapshot(), trigger=(1, "epoch"))
    trainer.run()

    with open(os.path.join(args.out, f"times_rank{comm.rank}.json"), "w") as f:
        json.dump({"rank": comm.rank}, f)
    with open(os.path.join(args.out, f"loss_{comm.rank}.txt"), "w") as f:
        f.write("0.5\n")
    with tempfile.NamedTemporaryFile("w", dir=args.out) as f:
        f.write("scratch")
    with open(os.devnull, "w") as f:
        f.write("nothing")
    if not args.guard or comm.rank == 0:
        model.predictor.save_structure(os.path.join(args.out, "model_structure.json"))
        with open(os.path.join(args.out, f"run-{os.getpid()}.txt"), "w") as f:
            f.write("done\n")


if __name__ == "__main__":
    main()
