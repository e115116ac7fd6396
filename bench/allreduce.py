"""Gradient averaging on ResNet-50's gradient set: mnify's communicators against baselines.

Run: ``.venv/bin/mpiexec --oversubscribe -n 2 .venv/bin/python bench/allreduce.py [--reps N]``
(as root also ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``).

Measured in the same run, interleaved round-robin so load on a shared machine hits every method
alike. Each rep's time is the slowest rank's; the ratios use the best rep of each method (load
from other processes only ever adds time, so minima are the stable figure on a shared machine),
the median is printed beside it:

- (a) raw mpi4py ``Allreduce`` (in place) of the same bytes as one float32 buffer, cut in chunks of
  each size in a sweep; the best chunk size is the baseline. The sweep is also the evidence for
  the communicators' default bucket size.
- mnify ``multi_node_mean_grad`` of ``flat`` (on one host it times single copy and the
  shared-memory segment on its first calls and keeps the faster: printed; each also alone, the
  segment with its slot sizes swept; with ``MNIFY_SHARED_MEMORY=0`` over MPI Allreduce: bucket
  sizes swept; once under the watchdog), ``naive``, ``hierarchical``, on a stand-in model
  holding the 161 float32 gradients (25.5 M floats) of ResNet-50.

The machine's load average is printed before and after: on a shared machine a figure means
little without it.
- (a') raw Allreduce plus the 1/size pass a mean needs: the floor for any mean built on MPI
  Allreduce.
- (b) ChainerMN's ``naive`` communicator (inside chainer 7.8.1) on a Chainer Link holding the same
  parameters, when ``import chainermn`` works.

Goals: flat <= 1.15x (a); flat >= 1.8x faster than (b).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnify.runtime.communicators import create_communicator, shared_memory  # noqa: E402

KB = 1 << 10
MB = 1 << 20


def resnet50_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of ResNet-50 (torchvision layout: 161 arrays, 25,557,032
    floats): a 7x7 stem without bias, bottleneck stages of 3/4/6/3 blocks, a 1000-way fc."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("conv1/W", (64, 3, 7, 7))]
    shapes += [("bn1/gamma", (64,)), ("bn1/beta", (64,))]
    in_ch = 64
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512)), start=1):
        out_ch = width * 4
        for block in range(blocks):
            p = f"res{stage + 1}/b{block}"
            for name, shape in (
                ("conv1", (width, in_ch, 1, 1)),
                ("conv2", (width, width, 3, 3)),
                ("conv3", (out_ch, width, 1, 1)),
            ):
                shapes.append((f"{p}/{name}/W", shape))
                shapes.append((f"{p}/bn{name[-1]}/gamma", (shape[0],)))
                shapes.append((f"{p}/bn{name[-1]}/beta", (shape[0],)))
            if block == 0:
                shapes.append((f"{p}/shortcut/W", (out_ch, in_ch, 1, 1)))
                shapes.append((f"{p}/bn_shortcut/gamma", (out_ch,)))
                shapes.append((f"{p}/bn_shortcut/beta", (out_ch,)))
            in_ch = out_ch
    shapes += [("fc/W", (1000, 2048)), ("fc/b", (1000,))]
    return shapes


class Param:
    def __init__(self, grad: np.ndarray) -> None:
        self.data = np.zeros_like(grad)
        self.grad = grad


class GradSet:
    """The stand-in model: anything with ``namedparams()`` will do for mnify."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], rank: int) -> None:
        rng = np.random.default_rng(rank)
        self.params = {n: Param(rng.standard_normal(s, dtype=np.float32)) for n, s in shapes}

    def namedparams(self) -> list[tuple[str, Param]]:
        return list(self.params.items())


def chainer_link(shapes: list[tuple[str, tuple[int, ...]]], rank: int) -> Any:
    import chainer

    link = chainer.Link()
    rng = np.random.default_rng(rank)
    with link.init_scope():
        for i, (_, shape) in enumerate(shapes):
            p = chainer.Parameter(np.zeros(shape, np.float32))
            p.grad = rng.standard_normal(shape, dtype=np.float32)
            setattr(link, f"p{i:03d}", p)
    return link


def timed(comm: MPI.Intracomm, fn: Callable[[], None]) -> float:
    comm.Barrier()
    start = time.perf_counter()
    fn()
    mine = time.perf_counter() - start
    return float(comm.allreduce(mine, op=MPI.MAX))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    shapes = resnet50_shapes()
    floats = sum(int(np.prod(s)) for _, s in shapes)
    nbytes = floats * 4

    methods: dict[str, Callable[[], None]] = {}

    raw = np.random.default_rng(rank).standard_normal(floats, dtype=np.float32)
    chunk_sizes = [256 * KB, 1 * MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB, nbytes]

    def raw_allreduce(chunk_bytes: int) -> Callable[[], None]:
        step = chunk_bytes // 4

        def run() -> None:
            for i in range(0, floats, step):
                world.Allreduce(MPI.IN_PLACE, raw[i : i + step], MPI.SUM)

        return run

    for c in chunk_sizes:
        label = "whole" if c == nbytes else f"{c // KB} KiB"
        methods[f"(a) raw Allreduce, {label} chunks"] = raw_allreduce(c)

    def raw_mean(chunk_bytes: int) -> Callable[[], None]:
        step = chunk_bytes // 4
        scale = np.float32(1.0 / size)

        def run() -> None:
            for i in range(0, floats, step):
                piece = raw[i : i + step]
                world.Allreduce(MPI.IN_PLACE, piece, MPI.SUM)
                np.multiply(piece, scale, out=piece)

        return run

    methods["(a') raw Allreduce + 1/size pass, 1 MiB"] = raw_mean(1 * MB)
    methods["(a') raw Allreduce + 1/size pass, 4 MiB"] = raw_mean(4 * MB)

    comms = []

    def flat(label: str, env: dict[str, str], slot_cap: int | None = None, **options: Any) -> None:
        """A flat communicator made under ``env`` (read at creation) and with shared-memory
        slots of ``slot_cap``, measured as ``label``."""
        os.environ.update(env)
        default_cap = shared_memory.SLOT_CAP
        shared_memory.SLOT_CAP = slot_cap or default_cap  # read when the segment is made
        comm = create_communicator("flat", **options)
        shared_memory.SLOT_CAP = default_cap
        for key in env:
            del os.environ[key]
        model = GradSet(shapes, rank)
        comms.append(comm)
        methods[label] = lambda: comm.multi_node_mean_grad(model)

    flat("mnify flat (defaults)", {})
    default_flat = comms[-1]
    flat("mnify flat, single copy only", {"MNIFY_SINGLE_COPY": "1"})
    segment = {"MNIFY_SINGLE_COPY": "0"}
    flat("mnify flat, segment only", segment)
    for cap in (128 * KB, 256 * KB, 512 * KB, 1 * MB, 2 * MB, 4 * MB):
        if cap != shared_memory.SLOT_CAP:
            flat(f"mnify flat, segment only, {cap // KB} KiB slots", segment, slot_cap=cap)
    for bucket in (1 * MB, 4 * MB):
        flat(
            f"mnify flat over MPI, {bucket // MB} MiB buckets",
            {"MNIFY_SHARED_MEMORY": "0"},
            bucket_bytes=bucket,
        )
    flat("mnify flat, watchdog on", {"MNIFY_WATCHDOG_TIMEOUT": "600"})
    for name in ("naive", "hierarchical"):
        comm = create_communicator(name)
        comms.append(comm)
        model = GradSet(shapes, rank)
        methods[f"mnify {name}"] = lambda c=comm, m=model: c.multi_node_mean_grad(m)

    chainermn_comm = None
    try:
        import chainermn

        chainermn_comm = chainermn.create_communicator("naive")
        link = chainer_link(shapes, rank)
        methods["(b) chainermn naive"] = lambda: chainermn_comm.multi_node_mean_grad(link)
    except Exception as err:  # chainermn needs chainer; the bench still runs without it
        if rank == 0:
            print(f"chainermn unavailable ({type(err).__name__}: {err}); skipping (b)")

    load_before = os.getloadavg()
    times: dict[str, list[float]] = {k: [] for k in methods}
    for fn in methods.values():  # warm-up: plans, buffers, MPI connections
        timed(world, fn)
    for _ in range(args.reps):
        for key, fn in methods.items():
            times[key].append(timed(world, fn))

    if rank != 0:
        return
    load_after = os.getloadavg()
    med = {k: float(np.min(v)) for k, v in times.items()}
    median = {k: float(np.median(v)) for k, v in times.items()}
    raw_keys = [k for k in med if k.startswith("(a)")]
    mean_keys = [k for k in med if k.startswith("(a')")]
    best_raw = min(raw_keys, key=lambda k: med[k])
    base = med[best_raw]
    print(
        f"ResNet-50 gradients: {len(shapes)} float32 arrays, {floats:,} floats "
        f"({nbytes / MB:.1f} MiB); {size} ranks; best and median of {args.reps} reps; "
        f"OMP threads {os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    print(
        f"load average (1/5/15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, "
        f"after {' '.join(f'{x:.2f}' for x in load_after)}; {os.cpu_count()} CPUs"
    )
    print(f"{'method':<42} {'best ms':>9} {'median ms':>10} {'vs best raw':>12} {'GB/s':>6}")
    for k in methods:
        print(
            f"{k:<42} {med[k] * 1e3:9.1f} {median[k] * 1e3:10.1f} {med[k] / base:11.2f}x "
            f"{nbytes / med[k] / 1e9:6.2f}"
        )
    flat_t = med["mnify flat (defaults)"]
    print(f"\nbest raw chunking: {best_raw}")
    chosen = [c.history for c in default_flat._mean_paths.values()]  # type: ignore[attr-defined]
    print(f"mnify flat (defaults) chose, per measurement round: {chosen or 'no choice to make'}")
    print(f"goal (a): mnify flat / best raw Allreduce = {flat_t / base:.2f}x (goal <= 1.15x)")
    floor = min(med[k] for k in mean_keys)
    print(
        f"          mnify flat / (raw Allreduce + the 1/size pass a mean needs) = "
        f"{flat_t / floor:.2f}x; that floor alone is {floor / base:.2f}x raw"
    )
    if "(b) chainermn naive" in med:
        b = med["(b) chainermn naive"]
        print(f"goal (b): chainermn naive / mnify flat = {b / flat_t:.2f}x faster (goal >= 1.8x)")
        print(f"          chainermn naive / best raw = {b / base:.2f}x")
    print(
        f"          mnify naive / chainermn naive = "
        f"{med['mnify naive'] / med.get('(b) chainermn naive', float('nan')):.2f}x"
    )
    # the same goals on medians (each against the best raw chunking by median)
    raw_median = min(median[k] for k in raw_keys)
    flat_median = median["mnify flat (defaults)"]
    line = f"medians: mnify flat / best raw = {flat_median / raw_median:.2f}x"
    if "(b) chainermn naive" in median:
        line += (
            f"; chainermn naive / mnify flat = {median['(b) chainermn naive'] / flat_median:.2f}x"
        )
    print(line)


if __name__ == "__main__":
    main()
