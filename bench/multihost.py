"""Hierarchical against flat and naive gradient averaging across hosts with a limited link.

Run (root; builds and always removes its own test bed)::

    .venv/bin/python bench/multihost.py [--rate 1gbit] [--reps 5] [--slots 2 2] [--map-by node] [--shm]

Two hosts (network namespaces on a bridge, see docs/testbed.md) with two ranks each; every
host's cable is limited to ``--rate`` in both directions with ``tc tbf``. Each rank holds
ResNet-50's gradient set (161 float32 arrays, 25.5 M floats, from bench/allreduce.py) and calls
``multi_node_mean_grad`` of mnify's ``naive``, ``flat`` and ``hierarchical`` communicators,
interleaved round-robin so load on a shared machine hits every method alike. A rep's time is the
slowest rank's; the table shows each method's best and median rep (load from other processes
only ever adds time, so the best rep is the stable figure) and the bytes each host put on its
cable per call, read from the host's own interface counters. Goal: hierarchical >= 1.3x faster
than flat. Not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

METHODS = ("naive", "flat", "hierarchical")
GOAL = 1.3


def host_bytes_sent() -> int:
    """Bytes this host has sent: its eth0 counter (the worker runs inside the host's namespace)."""
    return int(Path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def host_tcp_retransmits() -> int:
    """TCP segments this host has retransmitted (its namespace's /proc/net/snmp)."""
    rows = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
    names, values = [r for r in rows if r[0] == "Tcp:"][:2]
    return int(values[names.index("RetransSegs")])


def worker(reps: int) -> None:
    """One rank: time every method ``reps`` times; rank 0 prints the results as one JSON line."""
    import numpy as np
    from allreduce import GradSet, resnet50_shapes
    from mpi4py import MPI

    from mnify.runtime.communicators import create_communicator

    world = MPI.COMM_WORLD
    shapes = resnet50_shapes()
    comms = {name: create_communicator(name) for name in METHODS}
    models = {name: GradSet(shapes, world.Get_rank()) for name in METHODS}
    leader = comms["flat"].intra_rank == 0
    times: dict[str, list[float]] = {name: [] for name in METHODS}
    sent: dict[str, list[int]] = {name: [] for name in METHODS}
    resent: dict[str, list[int]] = {name: [] for name in METHODS}

    def once(name: str) -> tuple[float, int, int]:
        world.Barrier()
        before = (host_bytes_sent(), host_tcp_retransmits()) if leader else (0, 0)
        start = time.perf_counter()
        comms[name].multi_node_mean_grad(models[name])
        took = time.perf_counter() - start
        world.Barrier()
        after = (host_bytes_sent(), host_tcp_retransmits()) if leader else (0, 0)
        slowest = float(world.allreduce(took, op=MPI.MAX))
        return slowest, after[0] - before[0], after[1] - before[1]

    for name in METHODS:  # warm-up: connections, bucket plans, buffers
        once(name)
    for _ in range(reps):
        for name in METHODS:
            took, host_sent, host_resent = once(name)
            times[name].append(took)
            sent[name].append(host_sent)
            resent[name].append(host_resent)
    mine = (comms["flat"].host_name, sent, resent) if leader else None
    per_host = [p for p in world.gather(mine, root=0) or [] if p is not None]
    if world.Get_rank() == 0:
        floats = sum(int(np.prod(s)) for _, s in shapes)
        hosts = {h: {m: int(np.median(v)) for m, v in s.items()} for h, s, _ in per_host}
        retrans = {h: {m: int(sum(v)) for m, v in r.items()} for h, _, r in per_host}
        result = {
            "arrays": len(shapes),
            "floats": floats,
            "times": times,
            "bytes": hosts,
            "retransmits": retrans,
        }
        print("BENCH " + json.dumps(result), flush=True)
    for comm in comms.values():
        comm.finalize()


def drive(
    rate: str, reps: int, slots: list[int], map_by: str, shm: bool, mpi_args: list[str]
) -> None:
    from tests.support.testbed import testbed

    with testbed(len(slots)) as bed:
        bed.intra_host_shm = shm
        if rate != "none":
            bed.limit_rate(rate)
        run = bed.run(
            slots,
            Path(__file__),
            ["--worker", "--reps", str(reps)],
            timeout=60 + reps * 120,
            mpiexec_args=["--map-by", map_by, *mpi_args],
        )
    lines = [line for line in run.rank_lines(0) if line.startswith("BENCH ")]
    if not lines:
        raise SystemExit(f"no result from rank 0\n{run.describe()}")
    result = json.loads(lines[0][len("BENCH ") :])
    best = {m: min(result["times"][m]) for m in METHODS}
    median = {m: sorted(result["times"][m])[len(result["times"][m]) // 2] for m in METHODS}
    hosts = sorted(result["bytes"])
    print(
        f"ResNet-50 gradients: {result['arrays']} float32 arrays, {result['floats']:,} floats "
        f"({result['floats'] * 4 / 1e6:.1f} MB); hosts {', '.join(hosts)} with slots "
        f"{slots} (ranks mapped by {map_by}; same-host ranks over "
        f"{'shared memory' if shm else 'TCP'}); links limited to {rate} each way; "
        f"best and median of {reps} reps{'; ' + ' '.join(mpi_args) if mpi_args else ''}"
    )
    header = f"{'method':<14}{'best s':>9}{'median s':>10}{'hier faster':>13}"
    header += "".join(f"{'MB sent ' + h:>14}" for h in hosts)
    header += "".join(f"{'resent ' + h:>12}" for h in hosts)
    print(header)
    for m in METHODS:
        row = f"{m:<14}{best[m]:9.3f}{median[m]:10.3f}{best[m] / best['hierarchical']:12.2f}x"
        row += "".join(f"{result['bytes'][h][m] / 1e6:14.1f}" for h in hosts)
        row += "".join(f"{result['retransmits'][h][m]:12d}" for h in hosts)
        print(row)
    print("MB sent: median per call; resent: TCP segments retransmitted over all reps")
    speedup = best["flat"] / best["hierarchical"]
    typical = median["flat"] / median["hierarchical"]
    verdict = "met" if speedup >= GOAL else "MISSED"
    print(
        f"goal: hierarchical >= {GOAL}x faster than flat: best {speedup:.2f}x ({verdict}), "
        f"median {typical:.2f}x"
    )
    print("flat reps: " + " ".join(f"{t:.2f}" for t in result["times"]["flat"]))
    print("hierarchical reps: " + " ".join(f"{t:.2f}" for t in result["times"]["hierarchical"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rate", default="1gbit", help="tc rate per link and direction, or none")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--slots", type=int, nargs="+", default=[2, 2], help="ranks per host")
    parser.add_argument(
        "--map-by",
        default="slot",
        choices=["slot", "node"],
        help="slot: fill each host first (ranks 0,1 on mna); node: round-robin over hosts",
    )
    parser.add_argument(
        "--shm", action="store_true", help="ranks on one host talk through shared memory"
    )
    parser.add_argument(
        "--mpi-args",
        default="",
        help="extra mpiexec arguments, e.g. '--mca coll_tuned_use_dynamic_rules 1 "
        "--mca coll_tuned_allreduce_algorithm 4' (ring all-reduce)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.reps)
    else:
        drive(args.rate, args.reps, args.slots, args.map_by, args.shm, shlex.split(args.mpi_args))


if __name__ == "__main__":
    main()
