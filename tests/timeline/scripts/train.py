"""A tiny data-parallel training loop for the timeline tests (run under ``mnify run`` or mpiexec).

    train.py [--steps N] [--slow-rank R --sleep-ms MS] [--fail-at STEP] [--kill-at STEP]
             [--hang-at STEP] [--skew-ms MS] [--communicator NAME]

``--slow-rank R`` sleeps MS milliseconds on rank R before each update (a straggler);
``--slow-rank -2`` on every rank (the same work without a straggler).
``--fail-at`` raises on rank 1 at that step; ``--kill-at`` SIGKILLs rank 1 there (a job that
fails mid-way); ``--hang-at`` makes rank 1 sleep for two minutes there (the watchdog's case). ``--skew-ms`` shifts rank r's timeline clock by r * MS (plus a sign flip on odd
ranks) to test that the merge removes clock offsets. Prints ``DONE`` on each rank at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn
from mnify.runtime import timeline


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--fail-at", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--skew-ms", type=float, default=0.0)
    p.add_argument("--communicator", default="flat")
    args = p.parse_args()
    rank_env = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    if args.skew_ms:
        r = int(rank_env)
        skew = int(r * args.skew_ms * 1e6) * (-1 if r % 2 else 1)
        base = time.perf_counter_ns
        timeline.clock = lambda: base() + skew
        print(f"SKEW {r} {skew}", flush=True)

    comm = mn.create_communicator(args.communicator)
    model = L.Classifier(chainer.Sequential(L.Linear(32, 64), F.relu, L.Linear(64, 10)))
    opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
    opt.setup(model)
    rng = np.random.default_rng(comm.rank)
    for step in range(args.steps):
        x = rng.standard_normal((16, 32)).astype(np.float32)
        t = rng.integers(0, 10, 16).astype(np.int32)
        if comm.rank == 1 and step == args.fail_at:
            raise RuntimeError(f"failing on purpose at step {step}")
        if comm.rank == 1 and step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if comm.rank == 1 and step == args.hang_at:
            time.sleep(120)
        if args.slow_rank in (comm.rank, -2):
            time.sleep(args.sleep_ms / 1e3)
        opt.update(model, x, t)
    comm.allreduce_obj(1)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
