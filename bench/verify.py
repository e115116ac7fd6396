"""What ``--verify`` costs per update: the same training steps with and without it, one job.

Run: ``.venv/bin/mpiexec --oversubscribe -n 2 .venv/bin/python bench/verify.py [--reps N]``
(as root also ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``).

An MNIST-sized MLP (784-``--width``-``--width``-10, float32, batch ``--batch`` per rank) trains
through ``StandardUpdater``-style ``update(lossfun, x, t)`` calls on a scattered synthetic
dataset: first ``--reps`` steps with verification off (nothing installed), then verification
is started in the same process (the session ``mnify run --verify`` starts) for ``--reps + 1``
updates and the same steps are timed again: every one fingerprints its examples and digests
every parameter. The last update is the stop: rank 0 collects the records, finds the
source dataset and judges; it is timed on its own. A step's time is the slowest rank's.
Printed: median step off and on, their ratio (the overhead per verified update), the time
spent in verify's own hooks per update (what the ratio would be without load noise), the
stop's seconds and the machine's load. Never part of the tests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402

from mnify.runtime import update_watch  # noqa: E402
from mnify.runtime.communicators import create_communicator  # noqa: E402
from mnify.runtime.datasets import scatter_dataset  # noqa: E402
from mnify.runtime.optimizers import create_multi_node_optimizer  # noqa: E402


class MLP(chainer.Chain):
    def __init__(self, width: int) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(784, width)
            self.l2 = L.Linear(width, width)
            self.l3 = L.Linear(width, 10)

    def forward(self, x: Any) -> Any:
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--examples", type=int, default=20000)
    args = parser.parse_args()
    comm = create_communicator("flat")
    load_before = os.getloadavg()[0]
    data = None
    if comm.rank == 0:
        rng = np.random.RandomState(0)
        x = rng.rand(args.examples, 784).astype(np.float32)
        data = chainer.datasets.TupleDataset(x, rng.randint(0, 10, args.examples).astype(np.int32))
    train = scatter_dataset(data, comm, shuffle=True)
    it = chainer.iterators.SerialIterator(train, args.batch)
    model = L.Classifier(MLP(args.width))
    opt = create_multi_node_optimizer(chainer.optimizers.MomentumSGD(0.01), comm)
    opt.setup(model)

    def step() -> float:
        batch = it.next()
        x = np.stack([b[0] for b in batch])
        t = np.asarray([b[1] for b in batch])
        comm.mpi_comm.Barrier()
        began = time.perf_counter()
        opt.update(model, x, t)
        took = time.perf_counter() - began
        return float(comm.mpi_comm.allreduce(took, op=MPI.MAX))

    for _ in range(3):
        step()  # warm up: first broadcast, allocations
    assert not update_watch.is_installed()
    off = [step() for _ in range(args.reps)]

    from mnify.runtime.verify.session import start

    session = start(args.reps + 1, timeout=300)
    spent = [0.0]

    def timed(fn: Any) -> Any:
        def run(*a: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[0] += time.perf_counter() - began

        return run

    # verify's own work, timed where it runs: the observer and the link hook
    session.before_update = timed(session.before_update)  # type: ignore[method-assign]
    session.after_update = timed(session.after_update)  # type: ignore[method-assign]
    session.recorder.forward_preprocess = timed(session.recorder.forward_preprocess)  # type: ignore[method-assign]
    on = [step() for _ in range(args.reps)]
    own = float(comm.mpi_comm.allreduce(spent[0], op=MPI.MAX)) / args.reps
    began = time.perf_counter()
    try:
        step()
    except update_watch.UpdateLimitReached:
        pass
    stop = float(comm.mpi_comm.allreduce(time.perf_counter() - began, op=MPI.MAX))
    if comm.rank == 0:
        m_off, m_on = statistics.median(off), statistics.median(on)
        print(
            f"ranks {comm.size}, MLP 784-{args.width}-{args.width}-10, batch {args.batch}/rank, "
            f"{args.reps} steps each, {args.examples} examples"
        )
        print(f"step off: median {m_off * 1e3:.2f} ms (best {min(off) * 1e3:.2f})")
        print(f"step on:  median {m_on * 1e3:.2f} ms (best {min(on) * 1e3:.2f})")
        print(f"ratio on/off per update: {m_on / m_off:.3f} (best/best {min(on) / min(off):.3f})")
        print(
            f"verify's own work per update: {own * 1e3:.2f} ms, {own / m_off:.3f} of a step off "
            f"(ratio by work: {(m_off + own) / m_off:.3f})"
        )
        print(f"the stop (collect, find the source, judge): {stop:.2f} s")
        print(f"load average: {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
