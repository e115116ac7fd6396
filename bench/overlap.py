"""Step time with gradient averaging overlapped with backward, against the sequential path (CPU).

Run: ``.venv/bin/mpiexec --oversubscribe -n 2 .venv/bin/python bench/overlap.py [--reps N]``
(as root also ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``).

A stand-in model (an MLP of ``--layers`` square float32 Linear layers of ``--width``, one of
them applied twice) is trained with ``create_multi_node_optimizer(..., overlap=False)`` and
``overlap=True`` on the same communicator, steps interleaved round-robin so load on a shared
machine hits both alike. A step is one ``update(lossfun)``: forward, backward, the mean, the
update; its time is the slowest rank's. Printed: the best and median step of each, the ratio
overlap / sequential (below 1: overlap is faster), how many buckets started during backward,
and the machine's load average before and after. Never part of the tests.
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

from mnify.runtime.communicators import create_communicator  # noqa: E402
from mnify.runtime.optimizers import create_multi_node_optimizer  # noqa: E402


class StandIn(chainer.ChainList):
    """``layers`` Linear layers of ``width``; the second is applied twice (a shared one)."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__(*[L.Linear(width, width) for _ in range(layers)])

    def forward(self, x: Any) -> Any:
        h = x
        for i, link in enumerate(self):
            h = F.relu(link(h))
            if i == 1:
                h = F.relu(link(h))
        return h


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--comm", default="flat")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-mib", type=float, default=None, help="communicator buckets")
    args = parser.parse_args(argv)

    comm = create_communicator(args.comm)
    if args.bucket_mib:
        comm.set_config("bucket_bytes", int(args.bucket_mib * (1 << 20)))
    rank = comm.rank
    world = MPI.COMM_WORLD
    load_before = os.getloadavg()
    params = args.layers * (args.width * args.width + args.width)
    if rank == 0:
        print(
            f"bench/overlap.py: {comm.size} ranks, comm {args.comm!r}, {args.layers} x Linear"
            f"({args.width}), {params / 1e6:.1f} M float32 parameters "
            f"({params * 4 / (1 << 20):.0f} MiB), batch {args.batch}; load "
            f"{' '.join(f'{x:.2f}' for x in load_before)}",
            flush=True,
        )
    rng = np.random.RandomState(rank)
    xs = [rng.randn(args.batch, args.width).astype(np.float32) for _ in range(4)]
    runs: dict[str, tuple[Any, Any]] = {}
    for name, overlap in (("sequential", False), ("overlap", True)):
        np.random.seed(0)
        model = StandIn(args.layers, args.width)
        opt = create_multi_node_optimizer(chainer.optimizers.SGD(lr=1e-4), comm, overlap=overlap)
        opt.setup(model)
        runs[name] = (model, opt)

    def step(name: str, i: int) -> float:
        model, opt = runs[name]
        x = xs[i % len(xs)]
        world.Barrier()
        start = time.perf_counter()
        opt.update(lambda: F.mean(model(x) ** 2))
        elapsed = time.perf_counter() - start
        return float(world.allreduce(elapsed, op=MPI.MAX))

    for i in range(3):  # warm-up (the first update broadcasts; the second learns the order)
        for name in runs:
            step(name, i)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(args.reps):
        for name in runs if i % 2 == 0 else reversed(list(runs)):
            times[name].append(step(name, i))
    load_after = os.getloadavg()
    if rank == 0:
        for name, ts in times.items():
            print(
                f"{name:>10}: best {min(ts) * 1e3:8.1f} ms  median "
                f"{statistics.median(ts) * 1e3:8.1f} ms  ({len(ts)} steps)"
            )
        stats = runs["overlap"][1].overlap_stats
        best = min(times["overlap"]) / min(times["sequential"])
        med = statistics.median(times["overlap"]) / statistics.median(times["sequential"])
        print(f"ratio overlap / sequential: best {best:.3f}  median {med:.3f}")
        print(
            f"overlap: {stats.buckets} buckets a step, {stats.started_in_backward} started "
            f"during backward and {stats.started_at_wait} at wait over {stats.steps} steps"
        )
        print(f"load after: {' '.join(f'{x:.2f}' for x in load_after)}")
    comm.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
