"""What recording a timeline (``MNIFY_TIMELINE``) costs a training step.

Run: ``.venv/bin/python bench/timeline.py [--pairs 30] [--ranks 2]`` (as root also
``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``). It launches short 2-rank jobs
itself, with and without ``MNIFY_TIMELINE``, interleaved (on/off, then off/on, ...), so load
from other processes on a shared machine hits both alike. Each job runs two workloads:

- ``resnet50``: ``multi_node_mean_grad`` of ResNet-50's 161 float32 gradients (97.5 MiB) with the
  ``flat`` communicator (bench/allreduce.py's stand-in model): the gradient bench;
- ``mlp``: a small Chainer training loop (784-512-512-10 MLP, batch 64, SGD) through
  ``create_multi_node_optimizer``: forward, backward, averaging, update.

Two figures per workload:

1. the estimate the issue asks for: cost per recorded event x events per step / step time. The
   cost per event is measured inside the recording jobs as the difference between a wrapped
   call and the same call unwrapped (``kernels.pack`` of one float: the bucket/pack path; a
   collective on a one-rank communicator: the collective path), events per step are counted
   in the rank's ring, the step time is the median of the jobs without recording;
2. the confirmation: per pair, the ratio of the step time with recording to without, from
   each job's fastest step (load from other processes only ever adds time, so minima are the
   stable figure on a shared machine) and from its median step; the median of each ratio over
   the pairs with a 95% interval (order statistics), which on a loaded machine is mostly noise
   around 1.

Goal: overhead <= 2%. The machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# -- one job (a worker under mpiexec) -------------------------------------------------------------


def _median_step(fn: Any, steps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _per_call(fn: Any, calls: int) -> float:
    """Best of 5 of the mean time of one call (seconds)."""
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def worker(steps_resnet: int, steps_mlp: int) -> None:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    import numpy as np
    from allreduce import GradSet, resnet50_shapes  # type: ignore[import-not-found]

    from mnify.runtime import kernels, timeline
    from mnify.runtime.communicators import create_communicator

    comm = create_communicator("flat")
    rec = timeline.recorder()
    result: dict[str, Any] = {"recording": rec is not None}

    def events() -> int:
        return rec.head if rec is not None else 0

    # the gradient bench
    grads = GradSet(resnet50_shapes(), comm.rank)
    before = events()
    times = _median_step(lambda: comm.multi_node_mean_grad(grads), steps_resnet, 3)
    result["resnet50"] = {
        "step_s": statistics.median(times),
        "best_s": min(times),
        "events_per_step": (events() - before) / (steps_resnet + 3),
    }

    # a small training loop
    import chainer
    import chainer.functions as F
    import chainer.links as L

    from mnify import runtime as mn

    model = L.Classifier(
        chainer.Sequential(
            L.Linear(784, 512), F.relu, L.Linear(512, 512), F.relu, L.Linear(512, 10)
        )
    )
    opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
    opt.setup(model)
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal((64, 784)).astype(np.float32)
    t = rng.integers(0, 10, 64).astype(np.int32)
    before = events()
    times = _median_step(lambda: opt.update(model, x, t), steps_mlp, 5)
    result["mlp"] = {
        "step_s": statistics.median(times),
        "best_s": min(times),
        "events_per_step": (events() - before) / (steps_mlp + 5),
    }

    # what one recorded event costs: a wrapped call minus the same call unwrapped
    if rec is not None:
        one = comm.split(comm.rank, 0)  # a communicator of this rank alone
        tiny, out = [np.ones(1, np.float32)], np.zeros(1, np.float32)
        raw_pack = kernels.pack.__wrapped__  # type: ignore[attr-defined]
        pack_cost = _per_call(lambda: kernels.pack(tiny, out), 20000) - _per_call(
            lambda: raw_pack(tiny, out), 20000
        )
        raw_coll = one.allreduce_obj.__wrapped__  # type: ignore[attr-defined]
        coll_cost = _per_call(lambda: one.allreduce_obj(1), 5000) - _per_call(
            lambda: raw_coll(1), 5000
        )
        result["cost_per_event_s"] = {"pack": pack_cost, "collective": coll_cost}
    comm.barrier()
    if comm.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


# -- the driver -----------------------------------------------------------------------------------


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def run_job(ranks: int, recording: bool, steps_resnet: int, steps_mlp: int) -> dict[str, Any]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.pop("MNIFY_TIMELINE", None)
    with tempfile.TemporaryDirectory(prefix="mnify-bench-timeline-") as where:
        if recording:
            env["MNIFY_TIMELINE"] = where
        argv = [
            _mpiexec(), "--oversubscribe", "-x", "MNIFY_TIMELINE", "-n", str(ranks),
            sys.executable, __file__, "--worker", "--steps-resnet", str(steps_resnet),
            "--steps-mlp", str(steps_mlp),
        ]  # fmt: skip
        if not recording:
            argv.remove("-x")
            argv.remove("MNIFY_TIMELINE")
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.loads(line[len("RESULT ") :])
            assert data["recording"] == recording, data
            return data
    raise RuntimeError(f"worker failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def interval(values: list[float]) -> tuple[float, float]:
    """A 95% interval for the median from order statistics (binomial, normal approximation)."""
    xs = sorted(values)
    n = len(xs)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return xs[lo], xs[hi]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps-resnet", type=int, default=15)
    parser.add_argument("--steps-mlp", type=int, default=60)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps_resnet, args.steps_mlp)
        return
    load_before = os.getloadavg()
    print(f"{args.pairs} pairs of {args.ranks}-rank jobs; load average before: {load_before}")
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    ratios: dict[str, list[float]] = {"resnet50": [], "mlp": []}
    best_ratios: dict[str, list[float]] = {"resnet50": [], "mlp": []}
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        got = {rec: run_job(args.ranks, rec, args.steps_resnet, args.steps_mlp) for rec in order}
        for rec, data in got.items():
            runs[rec].append(data)
        for name in ratios:
            ratios[name].append(got[True][name]["step_s"] / got[False][name]["step_s"])
            best_ratios[name].append(got[True][name]["best_s"] / got[False][name]["best_s"])
        print(
            f"pair {pair + 1:>2}: "
            + "  ".join(
                f"{n} on/off median {ratios[n][-1]:.3f} best {best_ratios[n][-1]:.3f}"
                for n in ratios
            ),
            flush=True,
        )
    load_after = os.getloadavg()
    costs = {
        kind: statistics.median(r["cost_per_event_s"][kind] for r in runs[True])
        for kind in ("pack", "collective")
    }
    per_event = max(costs.values())
    print()
    print(
        f"cost per recorded event (median of {len(runs[True])} jobs): pack path "
        f"{costs['pack'] * 1e6:.2f} us, collective path {costs['collective'] * 1e6:.2f} us; "
        f"the estimate uses the larger"
    )
    header = (
        f"{'workload':<9} {'step off':>10} {'step on':>10} {'events/step':>12} "
        f"{'estimate':>9} {'on/off best':>12} {'95% interval':>15} {'on/off median':>14} "
        f"{'95% interval':>15}"
    )
    print(header)
    for name in ratios:
        off = statistics.median(r[name]["step_s"] for r in runs[False])
        on = statistics.median(r[name]["step_s"] for r in runs[True])
        events = statistics.median(r[name]["events_per_step"] for r in runs[True])
        estimate = per_event * events / off
        lo, hi = interval(ratios[name])
        blo, bhi = interval(best_ratios[name])
        print(
            f"{name:<9} {off * 1e3:>8.2f}ms {on * 1e3:>8.2f}ms {events:>12.1f} "
            f"{100 * estimate:>8.3f}% {statistics.median(best_ratios[name]):>12.4f} "
            f"{f'[{blo:.3f}, {bhi:.3f}]':>15} {statistics.median(ratios[name]):>14.4f} "
            f"{f'[{lo:.3f}, {hi:.3f}]':>15}"
        )
    print("step off/on: median over the jobs of each job's median step")
    print(f"goal: estimate <= 2%; load average after: {load_after}")


if __name__ == "__main__":
    main()
