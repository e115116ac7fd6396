"""A loop that all-reduces by hand and never steps an optimizer (the nnabla tutorial's style),
for the straggler rule's no-update case.

    hand_allreduce.py [--collectives N] [--sleep-ms MS] [--extra-rank R --extra-ms MS]

Every rank sleeps MS before each all-reduce; rank R sleeps MS more (a straggler). Prints
``DONE`` on each rank at the end.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mnify import runtime as mn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--collectives", type=int, default=60)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--extra-rank", type=int, default=-1)
    p.add_argument("--extra-ms", type=float, default=0.0)
    args = p.parse_args()
    comm = mn.create_communicator("flat")
    grads = [np.full(1000, float(comm.rank), np.float32)]
    for _ in range(args.collectives):
        pause = args.sleep_ms + (args.extra_ms if comm.rank == args.extra_rank else 0.0)
        if pause:
            time.sleep(pause / 1e3)
        comm.all_reduce(grads, division=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
