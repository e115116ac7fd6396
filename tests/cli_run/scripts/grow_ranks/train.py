"""A training script written for the global batch, run unchanged by ``mnify run --grow-ranks``.

    train.py OUT [--epochs E] [--batch B] [--grow [--max-per-rank M]]

float64, global-batch iterator (the whole dataset on every rank), Chainer's Trainer,
``GrowBatch(2)`` every epoch with ``--grow`` (accumulating above ``--max-per-rank``). After ``trainer.run()`` -- once, after the last
phase -- rank 0 saves the parameters to OUT/params.npz, and every rank prints ``AFTER RUN`` with
the world size and the iterator's position. Rank 0 prints ``EPOCH END`` with the iteration at
each epoch's end, from an extension of the lowest priority Chainer's own use (a snapshot's).
Every rank appends the examples it read to OUT/ledger.RANKS.RANK.txt (one line an iteration).
"""

from __future__ import annotations

import argparse
import os

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn

chainer.global_config.dtype = np.dtype(np.float64)


class Ledger(chainer.dataset.DatasetMixin):  # type: ignore[misc]
    def __init__(self, x: np.ndarray, t: np.ndarray, path: str) -> None:
        self.x, self.t, self.path = x, t, path
        self.iterator: object = None

    def __len__(self) -> int:
        return len(self.x)

    def get_example(self, i: int) -> tuple[np.ndarray, np.int32]:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{self.iterator.iteration} {i}\n")  # type: ignore[attr-defined]
        return self.x[i], self.t[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--grow", action="store_true")
    p.add_argument("--max-per-rank", type=int, default=None)
    args = p.parse_args()
    comm = mn.create_communicator("naive")
    rng = np.random.RandomState(0)
    x, t = rng.randn(24, 5), rng.randint(0, 3, 24).astype(np.int32)
    data = Ledger(x, t, os.path.join(args.out, f"ledger.{comm.size}.{comm.rank}.txt"))
    np.random.seed(comm.rank)  # only rank 0's initial weights count: the optimizer broadcasts
    model = L.Classifier(chainer.Sequential(L.Linear(5, 7), F.relu, L.Linear(7, 3)))
    optimizer = mn.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.05), comm)
    optimizer.setup(model)
    it = mn.create_global_batch_iterator(data, args.batch, comm, seed=1)
    data.iterator = it
    updater = chainer.training.StandardUpdater(it, optimizer)
    trainer = chainer.training.Trainer(updater, (args.epochs, "epoch"), out=args.out)
    if args.grow:
        trainer.extend(mn.extensions.GrowBatch(2, (1, "epoch"), max_per_rank=args.max_per_rank))

    @chainer.training.make_extension(trigger=(1, "epoch"), priority=-100)  # a snapshot's place
    def epoch_ends(trainer: chainer.training.Trainer) -> None:
        if comm.rank == 0:
            print(f"EPOCH END iteration={trainer.updater.iteration}", flush=True)

    trainer.extend(epoch_ends)
    trainer.run()
    print(f"AFTER RUN size={comm.size} iteration={updater.iteration}", flush=True)
    if comm.rank == 0:
        np.savez(
            os.path.join(args.out, "params.npz"),
            **{name: p.array for name, p in model.namedparams()},
        )


if __name__ == "__main__":
    main()
