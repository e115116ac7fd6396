"""Channel-parallel CNN: per-rank parameter memory and step time against the single-process original.

Run: ``.venv/bin/python bench/model_parallel.py [--ch 32 --size 16 --batch 32 --steps 10]``
(it converts ``fixtures/convert/model_parallel_cnn.in.py`` with ``mnify convert --model-parallel
channel`` and launches the converted model on 1, 2 and 3 ranks with mpiexec itself).

Measured in the same run:

- baseline: the original script's ``CNN`` in one process, SerialIterator batches,
  ``optimizer.update`` per step (what its StandardUpdater does);
- the converted ``CNN`` (its convolutions with >= size input channels become
  ``ParallelConvolution2D``) on n ranks, batches from ``create_multi_node_iterator``.

Step time is the slowest rank's mean over ``--steps`` steps after warm-up, median of ``--reps``
repetitions run round-robin over the configurations ("comm ms": the part of it spent in the communicator's allgather, allreduce and
bcast_obj, on that rank); parameter memory is the largest rank's bytes of parameter arrays. Both are printed
as ratios to the baseline. The seed reports channel parallelism at about 2x the single-GPU
time for DCGAN (on GPUs with NCCL; here: CPU ranks over MPI on a shared machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "convert" / "model_parallel_cnn.in.py"
sys.path.insert(0, str(REPO))


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(args: argparse.Namespace, script: Path, parallel: bool) -> dict[str, Any] | None:
    """Build the script's CNN, train ``steps`` steps; rank 0 returns the figures."""
    import chainer
    import chainer.links as L
    import numpy as np
    from chainer.dataset import concat_examples

    module = load_module(script)
    comm: Any = None
    np.random.seed(0)
    if parallel:
        from mnify import runtime as mn

        comm = mn.create_communicator("naive")
        comm_seconds = time_communication(comm)
        model = L.Classifier(module.CNN(ch=args.ch, comm=comm))
    else:
        model = L.Classifier(module.CNN(ch=args.ch))
    optimizer = chainer.optimizers.SGD(lr=0.01)
    optimizer.setup(model)
    n = args.batch * (args.steps + args.warmup)
    dataset = module.synthetic(n, size=args.size)
    iterator: Any = chainer.iterators.SerialIterator(dataset, args.batch, shuffle=False)
    if parallel:
        iterator = mn.create_multi_node_iterator(iterator, comm)

    def step() -> None:
        optimizer.update(model, *concat_examples(next(iterator)))

    times, comm_times = [], []
    for _ in range(args.reps):
        iterator.reset()
        for _ in range(args.warmup):
            step()
        if comm is not None:
            comm.barrier()
        if comm is not None:
            comm_seconds[0] = 0.0
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        elapsed = (time.perf_counter() - start) / args.steps
        if comm is not None:
            slowest = max(comm.allgather_obj((elapsed, comm_seconds[0] / args.steps)))
            elapsed = slowest[0]
            comm_times.append(slowest[1])
        times.append(elapsed)
    param_bytes = sum(int(p.array.nbytes) for p in model.params())
    per_rank = comm.allgather_obj(param_bytes) if comm is not None else [param_bytes]
    if comm is not None and comm.rank != 0:
        return None
    comm_s = float(np.median(comm_times)) if comm_times else 0.0
    return {"step_s": float(np.median(times)), "comm_s": comm_s, "param_bytes": per_rank}


def time_communication(comm: Any) -> list[float]:
    """Wrap the collectives the model-parallel pieces use; returns the running total (seconds)."""
    total = [0.0]
    for name in ("allgather", "allreduce", "bcast_obj"):
        method = getattr(comm, name)

        def timed(*a: Any, _method: Any = method, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return _method(*a, **k)
            finally:
                total[0] += time.perf_counter() - start

        setattr(comm, name, timed)
    return total


def worker(args: argparse.Namespace) -> None:
    result = measure(args, Path(args.worker), parallel=args.parallel)
    if result is not None:
        print("RESULT " + json.dumps(result), flush=True)


def run_worker(args: argparse.Namespace, script: Path, ranks: int | None) -> dict[str, Any]:
    flags = ["--ch", str(args.ch), "--size", str(args.size), "--batch", str(args.batch)]
    flags += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--reps", "1"]
    cmd = [sys.executable, __file__, "--worker", str(script), *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(REPO))
    if ranks is not None:
        from testkit.ranks import find_mpiexec, mpi_env

        env = mpi_env(env)
        cmd = [find_mpiexec(), "--oversubscribe", "-n", str(ranks), *cmd, "--parallel"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"no result from {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")


def median_run(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The repetition with the median step time (its comm time and memory come with it)."""
    ordered = sorted(results, key=lambda r: float(r["step_s"]))
    return ordered[len(ordered) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ch", type=int, default=32, help="the CNN's base channel count")
    parser.add_argument("--size", type=int, default=16, help="input images are size x size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranks", default="1,2,3")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--parallel", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    with tempfile.TemporaryDirectory(prefix="mnify-bench-mp-") as tmp:
        converted = Path(tmp) / "train_mn.py"
        mnify = str(Path(sys.executable).parent / "mnify")
        subprocess.run(
            [mnify, "convert", "--model-parallel", "channel", str(FIXTURE), "-o", str(converted)],
            check=True,
            capture_output=True,
        )
        configs: list[tuple[str, Path, int | None]] = [("original, 1 process", FIXTURE, None)]
        for n in [int(r) for r in args.ranks.split(",")]:
            configs.append((f"converted, {n} rank{'s' if n > 1 else ''}", converted, n))
        # Round-robin over the configurations, one repetition each per round, so that load from
        # other work on a shared machine falls on every configuration alike.
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in configs}
        for _ in range(args.reps):
            for name, script, ranks in configs:
                runs[name].append(run_worker(args, script, ranks))
        rows = [(name, median_run(results)) for name, results in runs.items()]
        base = rows[0][1]

    print(
        f"CNN ch={args.ch}, {args.size}x{args.size} input, batch {args.batch}, "
        f"{args.steps} steps x {args.reps} reps (median of slowest rank)"
    )
    print(
        f"{'run':<22} {'step ms':>9} {'x orig':>7} {'comm ms':>8} "
        f"{'params/rank KiB':>16} {'x orig':>7}"
    )
    for name, r in rows:
        mem = max(r["param_bytes"])
        print(
            f"{name:<22} {r['step_s'] * 1e3:>9.2f} {r['step_s'] / base['step_s']:>7.2f} "
            f"{r['comm_s'] * 1e3:>8.2f} {mem / 1024:>16.1f} {mem / max(base['param_bytes']):>7.2f}"
        )


if __name__ == "__main__":
    main()
