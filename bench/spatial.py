"""Spatial parallelism: step time, bytes communicated and activation memory, against the unsplit
model and channel parallelism, over image sizes.

Run: ``.venv/bin/python bench/spatial.py [--sizes 32,64,128,256,512,1024 --ch 8 --batch 1]``
(it launches its own workers with mpiexec: 1 rank for the unsplit model, 2 ranks for spatial
and channel parallelism, 4 ranks for the bytes only; ``--json FILE`` keeps the figures).

The model is the fully convolutional classifier people use on large images: three 3x3
convolutions (the middle one stride 2) with BatchNormalization and ReLU, a 3x3 max pooling,
global average pooling and a Linear head, float32, batch ``--batch``, SGD. The same model, same
seed, is run

- unsplit, in one process;
- ``create_spatial_parallel_model(model, comm)``: slabs of rows, halo exchange;
- ``create_channel_parallel_model(model, comm)``: each convolution's output channels split,
  outputs all-gathered, input gradients all-reduced.

Figures, per configuration and size:

- ``ms/step``: the slowest rank's mean time of a training step (forward, backward, update)
  after one warm-up step; fewer steps at large sizes (``--budget``);
- ``KiB/step``: what one rank sends per step, the largest rank's: halo rows (counted by the
  exchange itself), plus for each all-reduce ``2 (P-1)/P`` of its bytes and for each all-gather
  ``P-1`` copies of the rank's own part (what ring algorithms send); object messages (a few
  bytes) are not counted;
- ``halo wait``: the part of the (overlapped) spatial step still spent waiting for halo
  messages; ``sp plain`` is spatial with ``overlap=False`` (wait, then convolve);
- peak activation memory per rank during one step at ``--mem-size`` (tracemalloc: numpy's
  allocations; the parameters and the input batch, allocated before, are not counted, and the
  input is not divided: every rank holds all of it).

On this machine the ranks are processes sharing 2 CPU cores with other work: times are noisy
and a 2-rank run has at most 2 cores; bytes and memory are exact.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build_model(ch: int) -> Any:
    import chainer
    import chainer.functions as F
    import chainer.links as L

    class FCN(chainer.Chain):
        def __init__(self) -> None:
            super().__init__()
            with self.init_scope():
                self.conv1 = L.Convolution2D(3, ch, 3, pad=1, nobias=True)
                self.bn1 = L.BatchNormalization(ch)
                self.conv2 = L.Convolution2D(ch, 2 * ch, 3, stride=2, pad=1, nobias=True)
                self.bn2 = L.BatchNormalization(2 * ch)
                self.conv3 = L.Convolution2D(2 * ch, 2 * ch, 3, pad=1)
                self.fc = L.Linear(2 * ch, 10)

        def forward(self, x: Any) -> Any:
            h = F.relu(self.bn1(self.conv1(x)))
            h = F.max_pooling_2d(h, 3, 1, 1)
            h = F.relu(self.bn2(self.conv2(h)))
            h = F.relu(self.conv3(h))
            return self.fc(F.average(h, axis=(2, 3)))

    return L.Classifier(FCN())


class Meter:
    """Counts what the communicator is handed (see the module doc) and the halo waits."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.bytes = 0.0
        self.halo_wait = 0.0
        p = comm.size
        original_allreduce, original_allgather = comm.allreduce, comm.allgather
        original_finish = comm.finish_exchange

        def allreduce(x: Any, *a: Any, **k: Any) -> Any:
            self.bytes += 2 * (p - 1) / p * x.nbytes
            return original_allreduce(x, *a, **k)

        def allgather(x: Any, *a: Any, **k: Any) -> Any:
            self.bytes += (p - 1) * x.nbytes
            return original_allgather(x, *a, **k)

        def finish_exchange(requests: Any) -> None:
            start = time.perf_counter()
            original_finish(requests)
            self.halo_wait += time.perf_counter() - start

        comm.allreduce, comm.allgather = allreduce, allgather
        comm.finish_exchange = finish_exchange

    def halo_bytes(self) -> int:
        from mnify.runtime.functions.halo_exchange import counters

        return counters["halo_bytes_sent"]


def worker(args: argparse.Namespace) -> None:
    import chainer
    import numpy as np

    from mnify import runtime as mn

    comm = mn.create_communicator("naive") if args.config != "unsplit" else None
    meter = Meter(comm) if comm is not None else None
    results = []
    for size in args.sizes:
        np.random.seed(0)
        model = build_model(args.ch)
        if args.config == "spatial":
            model = mn.links.create_spatial_parallel_model(model, comm)
        elif args.config == "spatial_plain":
            model = mn.links.create_spatial_parallel_model(model, comm, overlap=False)
        elif args.config == "channel":
            model = mn.links.create_channel_parallel_model(model, comm)
        optimizer = chainer.optimizers.SGD(lr=0.01)
        optimizer.setup(model)
        rng = np.random.RandomState(size)
        x = rng.rand(args.batch, 3, size, size).astype(np.float32)
        t = rng.randint(0, 10, args.batch).astype(np.int32)
        optimizer.update(model, x, t)  # warm-up (and lazy initialisation)
        steps = args.steps or max(1, min(10, int(args.budget * 1e6 / (size * size))))
        row: dict[str, Any] = {"size": size, "steps": steps}
        if args.memory:
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            optimizer.update(model, x, t)
            row["peak_bytes"] = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
        else:
            sent0 = (meter.bytes + meter.halo_bytes()) if meter else 0
            wait0 = meter.halo_wait if meter else 0.0
            start = time.perf_counter()
            for _ in range(steps):
                optimizer.update(model, x, t)
            row["seconds"] = (time.perf_counter() - start) / steps
            if meter is not None:
                row["bytes"] = (meter.bytes + meter.halo_bytes() - sent0) / steps
                row["halo_wait"] = (meter.halo_wait - wait0) / steps
        if comm is not None:
            rows = comm.allgather_obj(row)
            row = {k: max(r[k] for r in rows) if k != "size" else v for k, v in row.items()}
        results.append(row)
    if comm is None or comm.rank == 0:
        Path(args.out).write_text(json.dumps(results), encoding="utf-8")


def launch(
    args: argparse.Namespace,
    config: str,
    ranks: int,
    sizes: list[int],
    memory: bool = False,
    steps: int = 0,
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--config",
            config,
            "--out",
            str(out),
            "--ch",
            str(args.ch),
            "--batch",
            str(args.batch),
            "--budget",
            str(args.budget),
            "--sizes",
            ",".join(map(str, sizes)),
            "--steps",
            str(steps),
        ]
        if memory:
            cmd.append("--memory")
        if config != "unsplit":
            from testkit.ranks import find_mpiexec, mpi_env

            cmd = [find_mpiexec(), "--oversubscribe", "-n", str(ranks), *cmd]
            env = mpi_env()
        else:
            import os

            env = dict(os.environ, PYTHONPATH=str(REPO))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
        rows: list[dict[str, Any]] = json.loads(out.read_text(encoding="utf-8"))
        return rows


def crossover(spatial: list[dict[str, Any]], channel: list[dict[str, Any]]) -> int | None:
    """The smallest size from which spatial is faster than channel at every larger size."""
    faster = [s["seconds"] < c["seconds"] for s, c in zip(spatial, channel, strict=True)]
    for i in range(len(faster)):
        if all(faster[i:]):
            return int(spatial[i]["size"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="32,64,128,256,512,1024")
    parser.add_argument("--ch", type=int, default=8, help="channels of the first convolution")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--budget", type=float, default=1.0, help="timed steps ~ budget * 1e6 / pixels (1..10)"
    )
    parser.add_argument("--mem-size", type=int, default=512)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    if args.worker:
        worker(args)
        return

    figures: dict[str, Any] = {"ch": args.ch, "batch": args.batch}
    figures["unsplit"] = launch(args, "unsplit", 1, args.sizes)
    figures["spatial2"] = launch(args, "spatial", 2, args.sizes)
    figures["spatial2_plain"] = launch(args, "spatial_plain", 2, args.sizes)
    figures["channel2"] = launch(args, "channel", 2, args.sizes)
    figures["spatial4"] = launch(args, "spatial", 4, args.sizes, steps=1)
    figures["channel4"] = launch(args, "channel", 4, args.sizes, steps=1)
    m = [args.mem_size]
    figures["memory"] = {
        "size": args.mem_size,
        "unsplit": launch(args, "unsplit", 1, m, memory=True)[0]["peak_bytes"],
        "spatial2": launch(args, "spatial", 2, m, memory=True)[0]["peak_bytes"],
        "spatial4": launch(args, "spatial", 4, m, memory=True)[0]["peak_bytes"],
        "channel2": launch(args, "channel", 2, m, memory=True)[0]["peak_bytes"],
    }
    figures["crossover_2_ranks"] = crossover(figures["spatial2"], figures["channel2"])

    print(
        f"FCN ch={args.ch} batch={args.batch} float32; ms/step (2 ranks), KiB sent per rank "
        "per step (2 and 4 ranks)"
    )
    print(
        f"{'size':>5} {'unsplit':>9} {'spatial':>9} {'sp plain':>9} {'channel':>9} {'halo wait':>9} "
        f"{'sp KiB 2':>9} {'ch KiB 2':>9} {'sp KiB 4':>9} {'ch KiB 4':>9}"
    )
    rows = zip(
        figures["unsplit"],
        figures["spatial2"],
        figures["spatial2_plain"],
        figures["channel2"],
        figures["spatial4"],
        figures["channel4"],
        strict=True,
    )
    for u, s, sp, c, s4, c4 in rows:
        print(
            f"{u['size']:>5} {u['seconds'] * 1e3:>9.1f} {s['seconds'] * 1e3:>9.1f} "
            f"{sp['seconds'] * 1e3:>9.1f} {c['seconds'] * 1e3:>9.1f} {s['halo_wait'] * 1e3:>9.1f} "
            f"{s['bytes'] / 1024:>9.1f} {c['bytes'] / 1024:>9.1f} "
            f"{s4['bytes'] / 1024:>9.1f} {c4['bytes'] / 1024:>9.1f}"
        )
    mem = figures["memory"]
    print(
        f"crossover (spatial faster than channel from this size on, 2 ranks): "
        f"{figures['crossover_2_ranks']}"
    )
    print(
        f"peak activation memory per rank at {mem['size']}x{mem['size']} (MiB): unsplit "
        f"{mem['unsplit'] / 2**20:.1f}, spatial 2 ranks {mem['spatial2'] / 2**20:.1f}, "
        f"spatial 4 ranks {mem['spatial4'] / 2**20:.1f}, channel 2 ranks "
        f"{mem['channel2'] / 2**20:.1f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
