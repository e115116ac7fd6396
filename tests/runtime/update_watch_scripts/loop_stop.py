"""A hand-written loop with two optimizers (a GAN-like pair: one multi-node, one plain) that asks
update_watch to stop after --stop updates; each rank prints ``RESULT {json}`` at exit."""

import argparse
import atexit
import json

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn
from mnify.runtime import update_watch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop", type=int, default=3)
    args = parser.parse_args()
    comm = mn.create_communicator("naive")
    gen, dis = L.Linear(2, 4), L.Linear(4, 1)
    opt_gen = mn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
    opt_gen.setup(gen)
    opt_dis = chainer.optimizers.SGD(0.01)
    opt_dis.setup(dis)
    counted = {"gen": [], "dis": []}

    class Observer:
        def after_update(self, optimizer, index):
            counted["gen" if optimizer is opt_gen else "dis"].append(index)

    update_watch.watch_updates(Observer())
    update_watch.stop_after_updates(args.stop, "test")
    state = {"finally": False}

    def report():
        print(
            "RESULT "
            + json.dumps(
                {
                    "rank": comm.rank,
                    "gen_t": opt_gen.t,
                    "dis_t": opt_dis.t,
                    "counted": counted,
                    "finally": state["finally"],
                }
            ),
            flush=True,
        )

    atexit.register(report)
    rng = np.random.RandomState(comm.rank)
    try:
        for _ in range(100):
            z = rng.rand(8, 2).astype(np.float32)
            loss_gen = -F.mean(dis(gen(z)))
            gen.cleargrads()
            loss_gen.backward()
            opt_gen.update()
            loss_dis = F.mean(dis(gen(z).array))
            dis.cleargrads()
            loss_dis.backward()
            opt_dis.update()
    finally:
        state["finally"] = True
    print("NOT STOPPED", flush=True)


if __name__ == "__main__":
    main()
