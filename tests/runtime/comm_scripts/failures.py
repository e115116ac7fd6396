"""Ranks that misbehave on purpose: the job must end, non-zero, naming the culprit.

Usage: ``failures.py SCENARIO``; the last rank is the culprit.

- ``sleep``: the culprit sleeps past the watchdog timeout before an allreduce.
- ``sleep_grads``: the same inside ``multi_node_mean_grad``.
- ``sleep_p2p``: rank 0 waits for a message the culprit never sends.
- ``raise``: the culprit raises while the others wait in an allreduce.
- ``shapes``: debug mode; the culprit passes a different shape to allreduce.
- ``kinds``: debug mode; the culprit enters bcast while the others enter allreduce.
- ``grads``: debug mode; the culprit has a gradient the others lack (zero_fill=False).
- ``recv_kind``: rank 0 expects an object, the culprit sends an array.
- ``drift``: watchdog on; rank 0 works for twice the timeout before a barrier; nobody may time
  out, since barrier is the untimed synchronisation point.
- ``catch``: every rank catches a CollectiveTimeout-free mismatch and carries on (the error is
  an ordinary exception, raised on every rank alike).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from mnify.runtime.communicators import create_communicator
from mnify.runtime.errors import CollectiveMismatch


class Param:
    def __init__(self, grad: np.ndarray) -> None:
        self.data = np.zeros_like(grad)
        self.grad = grad


class Model:
    def __init__(self, params: dict[str, Param]) -> None:
        self.params = params

    def namedparams(self):  # type: ignore[no-untyped-def]
        return list(self.params.items())


def main(scenario: str) -> None:
    comm = create_communicator("flat")
    r, n = comm.rank, comm.size
    culprit = n - 1
    comm.allreduce(np.ones(3))  # one collective that works first
    print(f"READY {r}", flush=True)
    if scenario == "sleep":
        if r == culprit:
            time.sleep(60)
        comm.allreduce(np.ones(3, np.float32))
    elif scenario == "sleep_grads":  # the wait is a barrier inside the shared-memory mean
        model = Model({"/w": Param(np.ones((64, 64), np.float32))})
        comm.multi_node_mean_grad(model)
        if r == culprit:
            time.sleep(60)
        comm.multi_node_mean_grad(model)
    elif scenario == "sleep_p2p":
        if r == 0:
            comm.recv(culprit, tag=5)
        elif r == culprit:
            time.sleep(60)
    elif scenario == "raise":
        if r == culprit:
            raise ValueError(f"rank {r} gives up on purpose")
        comm.allreduce(np.ones(3))
    elif scenario == "shapes":
        shape = (5, 3) if r == culprit else (4, 3)
        comm.allreduce(np.ones(shape, np.float32))
    elif scenario == "kinds":
        if r == culprit:
            comm.bcast(np.ones(2))
        else:
            comm.allreduce(np.ones(2))
    elif scenario == "grads":
        params = {"/w": Param(np.ones((2, 2), np.float32))}
        if r == culprit:
            params["/extra"] = Param(np.ones(3, np.float32))
        comm.multi_node_mean_grad(Model(params))
    elif scenario == "recv_kind":
        if r == 0:
            comm.recv_obj(culprit, tag=1)
        elif r == culprit:
            comm.send(np.ones(2), 0, tag=1)
    elif scenario == "drift":
        if r == 0:
            time.sleep(2 * float(os.environ["MNIFY_WATCHDOG_TIMEOUT"]))
        comm.barrier()
        total = comm.allreduce(np.ones(1))
        print(f"AFTER {r} {float(total[0])}", flush=True)
    elif scenario == "catch":
        try:
            comm.allreduce(np.ones(2 + (r == culprit)))
        except CollectiveMismatch as err:
            print(f"CAUGHT {r} {err}", flush=True)
        total = comm.allreduce(np.ones(1))
        print(f"AFTER {r} {float(total[0])}", flush=True)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(f"END {r}", flush=True)
    comm.finalize()


if __name__ == "__main__":
    main(sys.argv[1])
