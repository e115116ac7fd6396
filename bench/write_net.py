"""What the write net (``MNIFY_WRITE_NET``, on by default) costs a step of the bundled example.

Run: ``.venv/bin/mpiexec --oversubscribe -n 2 .venv/bin/python bench/write_net.py [--epochs 10]``
(as root also ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``; ``OMP_NUM_THREADS=1``
on a small machine).

Rank 0 converts examples/mnist/train_mnist.py with ``mnify convert`` (what scripts/demo.sh
runs); every rank then runs the converted script in this process, as ``__main__``, with the
example's own sizes (784-1000-1000-10 MLP, batch 100 per rank, Adam) on ``--examples`` random
examples on CPU, three times:

1. a warm-up with the net off (discarded: first imports, allocations);
2. with the net off (``MNIFY_WRITE_NET=0``: no audit hook exists);
3. with the net on (``create_communicator`` installs its audit hook, which stays: a hook cannot
   be removed, so the order cannot alternate).

A step is the time from one ``StandardUpdater.update`` call to the next: the whole Trainer
iteration (forward, backward, averaging, update, extensions). Printed: the median and best step
of runs 2 and 3 (the slowest rank's) and their ratio, which on a loaded machine is mostly noise
around 1; and the estimate by work: every audit event one step of run 3 raises is captured in a
fourth, untimed run, then replayed through a fresh copy of the net's hook (holding the files
run 3 recorded, as the live one does) and timed: hook time per step / median step without the
net. The goal is < 1% of a step. At exit the net's own report follows (nothing, the converted
script guards its writes). Never part of the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mpi4py import MPI

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from chainer.training import updaters  # noqa: E402

from mnify import environment  # noqa: E402
from mnify.runtime import write_net  # noqa: E402
from mnify.runtime.file_writes import WriteFilter  # noqa: E402

EXAMPLE = REPO / "examples" / "mnist" / "train_mnist.py"


class StepClock:
    """Wraps ``StandardUpdater.update``: the start of every update, and a callback there."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.at_step: Any = None
        original = updaters.StandardUpdater.update
        clock = self

        def update(updater: Any) -> None:
            clock.starts.append(time.perf_counter())
            if clock.at_step is not None:
                clock.at_step()
            original(updater)

        updaters.StandardUpdater.update = update  # type: ignore[method-assign]

    def steps(self) -> list[float]:
        """Seconds between consecutive update starts (each a whole Trainer iteration)."""
        return [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """The example's progress bar and report go to /dev/null (at the descriptor: the progress
    bar holds the sys.stdout of its import time)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)


def run_example(script: str, out: str, epochs: int, examples: int, net: bool) -> None:
    os.environ[environment.WRITE_NET.name] = "1" if net else "0"
    sys.argv = [script, "--device", "-1", "--synthetic", str(examples), "--epoch", str(epochs)]
    sys.argv += ["--noplot", "--out", out]
    with quiet_stdout():
        runpy.run_path(script, run_name="__main__")


def slowest(comm: MPI.Intracomm, value: float) -> float:
    return float(comm.allreduce(value, op=MPI.MAX))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--examples", type=int, default=2000, help="random examples (all ranks)")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    load_before = os.getloadavg()[0]
    work = comm.bcast(tempfile.mkdtemp(prefix="mnify-bench-net-") if comm.rank == 0 else None)
    script = os.path.join(work, "train_mnist_mn.py")
    if comm.rank == 0:
        subprocess.run(
            [sys.executable, "-m", "mnify", "convert", str(EXAMPLE), "-o", script],
            check=True,
            capture_output=True,
        )
    comm.Barrier()
    clock = StepClock()
    out = os.path.join(work, "result")

    run_example(script, out + "-warm", 2, args.examples, net=False)
    assert write_net.current() is None
    clock.starts.clear()
    run_example(script, out + "-off", args.epochs, args.examples, net=False)
    off = clock.steps()
    assert write_net.current() is None, "the net was on in the run without it"
    clock.starts.clear()
    run_example(script, out + "-on", args.epochs, args.examples, net=True)
    on = clock.steps()
    live = write_net.current()
    assert live is not None, "the net did not start"

    # what one step raises: every audit event, cut at the update starts (a hook of our own)
    events: list[tuple[str, tuple[Any, ...]]] = []
    cuts: list[int] = []
    sys.addaudithook(lambda event, a: events.append((event, a)))
    clock.at_step = lambda: cuts.append(len(events))
    run_example(script, out + "-count", 2, args.examples, net=True)
    clock.at_step = None
    per_step = [events[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    replica = write_net.WriteRecord(
        files=dict(live.files), skipped=set(live.skipped), filter=WriteFilter.for_this_rank()
    )
    hook = write_net.audit_hook(replica)
    spent = []
    for step_events in per_step:
        best = float("inf")
        for _ in range(args.replays):
            began = time.perf_counter()
            for event, a in step_events:
                hook(event, a)
            best = min(best, time.perf_counter() - began)
        spent.append(best)
    hook_per_step = slowest(comm, statistics.median(spent))
    counts = [len(s) for s in per_step]
    kinds = Counter(e for s in per_step for e, _ in s).most_common(4)
    opens = [sum(1 for e, _ in s if e == "open") for s in per_step]

    m_off = slowest(comm, statistics.median(off))
    m_on = slowest(comm, statistics.median(on))
    b_off, b_on = slowest(comm, min(off)), slowest(comm, min(on))
    events_per_step = slowest(comm, statistics.median(counts))
    opens_per_step = slowest(comm, statistics.median(opens))
    if comm.rank == 0:
        print(
            f"examples/mnist/train_mnist.py converted, {comm.size} ranks, MLP 784-1000-1000-10, "
            f"batch 100/rank, Adam, {args.examples} random examples, {len(off)} and {len(on)} "
            "steps"
        )
        print(f"step without the net: median {m_off * 1e3:.2f} ms (best {b_off * 1e3:.2f})")
        print(f"step with the net:    median {m_on * 1e3:.2f} ms (best {b_on * 1e3:.2f})")
        print(f"ratio with/without: {m_on / m_off:.4f} (best/best {b_on / b_off:.4f})")
        print(
            f"audit events per step: {events_per_step:g} ({opens_per_step:g} opens); the net's "
            f"hook: {hook_per_step * 1e6:.2f} us per step = {hook_per_step / m_off:.5%} of a "
            f"step (ratio by work: {(m_off + hook_per_step) / m_off:.5f})"
        )
        mix = ", ".join(f"{name} {n / len(per_step):.1f}" for name, n in kinds)
        print(f"events a step on rank 0: {mix}")
        print(f"load average: {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
        print("the net's report at exit (nothing: the converted script guards its writes):")
        sys.stdout.flush()
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
