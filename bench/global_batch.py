"""The global-batch iterator: what the speed split buys with a slow rank, and what it costs.

One MPI job (2 ranks by default) measures, in the same processes:

1. **speed vs even** -- rank 1 is made 3x slower per example than rank 0 (each example sleeps
   ``--ms`` ms on rank 0 and 3x that on rank 1 inside the model's forward, on top of the real
   compute; sleeping keeps the ranks from competing for the machine's cores). Median step time
   with ``split="speed"`` against ``split="even"``, same global batch. Theory for 2 ranks: even
   waits for the slow rank's half (3 * N/2 units), speed gives it a quarter (3/4 * N units): 0.5x.
2. **overhead** -- without any slowdown: median step time and ``next()`` time of the global
   iterator (even split) against ``scatter_dataset`` + ``SerialIterator`` with the per-rank batch
   N/size (the same examples per rank and step).

3. **memory** -- every rank needs the whole training set: the growth of each rank's
   proportional set size (PSS: a page shared by k processes counts 1/k in each) from before rank
   0 makes a ``--mb`` MB TupleDataset to when every rank holds it (and read it), through
   ``comm.bcast_obj`` (a copy per rank) against ``mn.bcast_dataset`` (one copy per host, in
   shared memory). One launch each.

    .venv/bin/python bench/global_batch.py                 # 2 ranks, global batch 64
    .venv/bin/python bench/global_batch.py -n 3 --batch 96 --ms 1

Not a test: numbers depend on the machine; read the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXAMPLES, FEATURES, CLASSES = 4096, 64, 10


def worker(batch: int, ms: float, steps: int, rounds: int) -> None:
    """One rank: every measurement, rank 0 prints the medians as one JSON line."""
    import chainer
    import chainer.functions as F
    import chainer.links as L
    import numpy as np

    from mnify import runtime as mn

    comm = mn.create_communicator("naive")
    rng = np.random.RandomState(0)
    data = chainer.datasets.TupleDataset(
        rng.randn(EXAMPLES, FEATURES).astype(np.float32),
        rng.randint(0, CLASSES, EXAMPLES).astype(np.int32),
    )

    class MLP(chainer.Chain):
        def __init__(self, per_example_s: float) -> None:
            super().__init__()
            self.per_example_s = per_example_s
            with self.init_scope():
                self.l1 = L.Linear(FEATURES, 256)
                self.l2 = L.Linear(256, CLASSES)

        def forward(self, x: Any) -> Any:
            if self.per_example_s:
                time.sleep(self.per_example_s * len(x))
            return self.l2(F.relu(self.l1(x)))

    def step_times(iterator: Any, per_example_s: float, warmup: int) -> tuple[list[float], Any]:
        np.random.seed(0)
        model = L.Classifier(MLP(per_example_s))
        opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
        opt.setup(model)
        updater = chainer.training.StandardUpdater(iterator, opt)
        times = []
        for i in range(warmup + steps):
            comm.barrier()  # published: the speed split does not count it as compute
            started = time.perf_counter()
            updater.update()
            comm.barrier()  # published: the speed split does not count it as compute
            if i >= warmup:
                times.append(time.perf_counter() - started)
        return times, iterator

    def median_ms(values: list[float]) -> float:
        return 1000 * statistics.median(values)

    slow = (ms / 1000) * (3 if comm.rank == 1 else 1)
    results: dict[str, Any] = {"ranks": comm.size, "batch": batch, "ms": ms, "steps": steps}

    even, _ = step_times(mn.create_global_batch_iterator(data, batch, comm), slow, 3)
    speed, speed_it = step_times(
        mn.create_global_batch_iterator(data, batch, comm, split="speed"), slow, 10
    )
    results["even_step_ms"] = median_ms(even)
    results["speed_step_ms"] = median_ms(speed)
    results["speed_shares"] = speed_it.shares

    shard = mn.scatter_dataset(data if comm.rank == 0 else None, comm, shuffle=True, seed=0)
    global_times: list[float] = []
    serial_times: list[float] = []
    ratios: list[float] = []
    for _ in range(rounds):  # alternated, so a busy moment of the machine hits both alike
        g = step_times(mn.create_global_batch_iterator(data, batch, comm), 0.0, 5)[0]
        s = step_times(chainer.iterators.SerialIterator(shard, batch // comm.size), 0.0, 5)[0]
        global_times += g
        serial_times += s
        ratios.append(statistics.median(g) / statistics.median(s))
    results["global_step_ms"] = median_ms(global_times)
    results["scatter_step_ms"] = median_ms(serial_times)
    results["overhead_ratios"] = ratios

    def next_times(iterator: Any) -> float:
        for _ in range(5):
            iterator.next()
        taken = []
        for _ in range(200):
            started = time.perf_counter()
            iterator.next()
            taken.append(time.perf_counter() - started)
        return 1e6 * statistics.median(taken)

    results["global_next_us"] = next_times(mn.create_global_batch_iterator(data, batch, comm))
    results["speed_next_us"] = next_times(
        mn.create_global_batch_iterator(data, batch, comm, split="speed")
    )
    results["serial_next_us"] = next_times(
        chainer.iterators.SerialIterator(shard, batch // comm.size)
    )
    if comm.rank == 0:
        print("RESULT " + json.dumps(results), flush=True)


def pss_mb() -> float:
    """This process's proportional set size in MB (Linux)."""
    with open("/proc/self/smaps_rollup", encoding="utf-8") as stream:
        for line in stream:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_worker(how: str, megabytes: int) -> None:
    """One rank: rank 0 makes the dataset; every rank's PSS growth until it holds all of it."""
    import chainer
    import numpy as np

    from mnify import runtime as mn

    comm = mn.create_communicator("naive")
    rows = megabytes * 1024 * 1024 // (4 * 1000)
    comm.barrier()
    before = pss_mb()  # before rank 0 makes the dataset: growth is what holding it costs
    made = None
    if comm.rank == 0:
        x = np.random.RandomState(0).rand(rows, 1000).astype(np.float32)
        made = chainer.datasets.TupleDataset(x, np.arange(rows, dtype=np.int32))
        del x
    data = comm.bcast_obj(made) if how == "bcast_obj" else mn.bcast_dataset(made, comm)
    del made  # as `train = comm.bcast_obj(train)` does: rank 0 keeps what it got back
    gc.collect()
    x_all, t_all = data._datasets
    # read every page, as training does (a mapped page counts only once it is touched)
    assert np.isfinite(float(x_all.sum(dtype=np.float64)) + float(t_all.sum()))
    comm.barrier()
    growth = comm.gather_obj(pss_mb() - before)
    if comm.rank == 0:
        print("RESULT " + json.dumps({"how": how, "growth": growth}), flush=True)


def launch_memory(n: int, how: str, megabytes: int) -> dict[str, Any]:
    from testkit.ranks import find_mpiexec, mpi_env

    cmd = [find_mpiexec(), "--oversubscribe", "-n", str(n), sys.executable]
    cmd += [str(Path(__file__).resolve()), "--memory-worker", how, "--mb", str(megabytes)]
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def launch(n: int, batch: int, ms: float, steps: int, rounds: int) -> dict[str, Any]:
    from testkit.ranks import find_mpiexec, mpi_env

    cmd = [
        find_mpiexec(),
        "--oversubscribe",
        "-n",
        str(n),
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--batch",
        str(batch),
        "--ms",
        str(ms),
        "--steps",
        str(steps),
        "--rounds",
        str(rounds),
    ]
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    parser.add_argument("--ms", type=float, default=1.0, help="sleep per example, fast rank")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per variant")
    parser.add_argument("--rounds", type=int, default=5, help="alternations, overhead part")
    parser.add_argument("--mb", type=int, default=200, help="dataset MB, memory part")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--memory-worker", choices=["bcast_obj", "bcast_dataset"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.batch, args.ms, args.steps, args.rounds)
        return
    if args.memory_worker:
        memory_worker(args.memory_worker, args.mb)
        return
    r = launch(args.n, args.batch, args.ms, args.steps, args.rounds)
    print(
        f"{r['ranks']} ranks, global batch {r['batch']}, rank 1 3x slower per example "
        f"({r['ms']:g} ms vs {3 * r['ms']:g} ms), median of {r['steps']} steps"
    )
    print(
        f"step time: split=even {r['even_step_ms']:.1f} ms, split=speed {r['speed_step_ms']:.1f} ms "
        f"(shares {r['speed_shares']}): ratio {r['speed_step_ms'] / r['even_step_ms']:.2f}x "
        "(theory 0.50x on 2 ranks)"
    )
    print(
        f"no slowdown: step time global iterator {r['global_step_ms']:.2f} ms, scatter_dataset + "
        f"SerialIterator {r['scatter_step_ms']:.2f} ms: ratio "
        f"{r['global_step_ms'] / r['scatter_step_ms']:.2f}x (per alternation: "
        f"{', '.join(f'{x:.2f}' for x in r['overhead_ratios'])}; median "
        f"{statistics.median(r['overhead_ratios']):.2f}x)"
    )
    print(
        f"next(): global (even) {r['global_next_us']:.0f} us, global (speed, one allgather) "
        f"{r['speed_next_us']:.0f} us, SerialIterator on the shard {r['serial_next_us']:.0f} us"
    )
    memory = {how: launch_memory(args.n, how, args.mb) for how in ("bcast_obj", "bcast_dataset")}
    obj, shared = memory["bcast_obj"]["growth"], memory["bcast_dataset"]["growth"]
    print(
        f"memory, the whole {args.mb} MB training set on every rank (PSS growth per rank): "
        f"bcast_obj {', '.join(f'{g:.0f}' for g in obj)} MB, bcast_dataset "
        f"{', '.join(f'{g:.0f}' for g in shared)} MB; all ranks together "
        f"{sum(obj):.0f} MB vs {sum(shared):.0f} MB ({sum(obj) / max(sum(shared), 1):.1f}x)"
    )


if __name__ == "__main__":
    main()
