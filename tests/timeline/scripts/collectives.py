"""Every kind of collective once, on 2 ranks, for the timeline tests (no Chainer).

    collectives.py NAME [--only-rank1]

``--only-rank1``: rank 0 drops ``MNIFY_TIMELINE`` before making its communicator (the variable
reached only some ranks). Prints ``WRAPPED True|False`` (whether the timeline observes the
communicator) and ``PASS collectives`` at the end (tests/support/rank_checks).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from mnify import environment
from mnify.runtime import observers, timeline
from mnify.runtime.communicators import create_communicator
from tests.support.rank_checks import passed


class Param:
    def __init__(self, n: int) -> None:
        self.data = np.ones(n, np.float32)
        self.grad = np.full(n, 2.0, np.float32)


class Model:
    def __init__(self) -> None:
        # small arrays packed together, a large one reduced in its own buckets
        self.params = {f"p{i}": Param(n) for i, n in enumerate([7, 300, 40, 600_000])}

    def namedparams(self) -> list[tuple[str, Param]]:
        return list(self.params.items())


def main() -> None:
    name = sys.argv[1]
    if "--only-rank1" in sys.argv and os.environ.get("OMPI_COMM_WORLD_RANK") == "0":
        os.environ.pop(environment.TIMELINE.name, None)
    comm = create_communicator(name)
    print("WRAPPED", timeline.observes(comm), flush=True)
    model = Model()
    comm.bcast_data(model)
    for _ in range(3):
        observers.update_begins(None)
        comm.multi_node_mean_grad(model)
        observers.apply_begins(None)
        observers.update_ends(None)
    comm.allreduce(np.arange(5.0))
    comm.bcast(np.arange(3.0) if comm.rank == 0 else None)
    comm.allgather(np.arange(comm.rank + 1.0))
    comm.gather_obj({"rank": comm.rank})
    comm.alltoall([np.arange(2.0)] * comm.size)
    comm.scatter([np.arange(2.0)] * comm.size if comm.rank == 0 else None)
    if comm.rank == 0:
        comm.send(np.arange(1000, dtype=np.float64), dest=1, tag=3)
    else:
        assert comm.recv(0, tag=3).nbytes == 8000
    sub = comm.split(color=0, key=-comm.rank)  # the same ranks, reversed: another communicator
    sub.allreduce_obj(1)
    sub.barrier()
    comm.barrier()
    passed("collectives")


if __name__ == "__main__":
    main()
