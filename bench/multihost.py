"""Hierarchical against flat and naive gradient averaging across hosts with a limited link.

Run (root; builds and always removes its own test bed)::

    .venv/bin/python bench/multihost.py [--rate 1gbit] [--reps 5] [--slots 2 2] [--map-by node] [--shm]
        [--methods flat two_dimensional] [--mpi-args '...']

Two hosts (network namespaces on a bridge, see docs/testbed.md) with two ranks each; every
host's cable is limited to ``--rate`` in both directions with ``tc tbf``. Each rank holds
ResNet-50's gradient set (161 float32 arrays, 25.5 M floats, from bench/allreduce.py) and calls
``multi_node_mean_grad`` of mnify's ``naive``, ``flat``, ``hierarchical`` and ``two_dimensional``
communicators, interleaved round-robin so load on a shared machine hits every method alike. A
rep's time is the slowest rank's; the table shows each method's best and median rep and its
median's ratio to the link floor, and per host the bytes put on its cable per call (its own
interface counters), the TCP segments it retransmitted and the packets its link's shaper dropped
(``tc -s qdisc`` of its eth0) over all reps.

The link floor is what the link allows at best: an all-reduce over H hosts must send
2 (H - 1) / H of the gradients' bytes out of every host (a reduce-scatter and an all-gather of
the hosts' shares), at ``--rate``: 0.82 s for ResNet-50 on 2 hosts at 1 Gbit/s (payload only;
Ethernet, IP and TCP headers add ~4.5% on the wire). Goal (issue 16): the method ``auto`` picks
has a median within 1.15x of the floor. The load average (``uptime``) before and after the
launch is printed with the figures. Not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

METHODS = ("naive", "flat", "hierarchical", "two_dimensional")
GOAL = 1.15  # auto's median / link floor
FP16 = "+fp16"  # a method suffix: shares cross hosts as float16, so its floor is half
_RATE = re.compile(r"^([0-9.]+)\s*([kmgt]?)(bit|bps)?$")


def rate_bits_per_s(rate: str) -> float | None:
    """A tc rate (``1gbit``, ``500mbit``, ``100mbps`` = bytes) in bits per second; None for
    ``none``."""
    if rate == "none":
        return None
    found = _RATE.match(rate.strip().lower())
    if found is None:
        raise ValueError(f"cannot read the rate {rate!r} (e.g. 1gbit, 500mbit)")
    value, prefix, unit = found.groups()
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[prefix]
    return float(value) * scale * (8 if unit == "bps" else 1)


def link_floor_s(grad_bytes: int, hosts: int, rate: str) -> float | None:
    """Seconds the slowest link needs at best: each host sends 2 (H - 1) / H of the gradients
    (payload bytes) at ``rate``."""
    bits = rate_bits_per_s(rate)
    if bits is None or hosts < 2:
        return None
    return 2 * (hosts - 1) / hosts * grad_bytes * 8 / bits


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def host_bytes_sent() -> int:
    """Bytes this host has sent: its eth0 counter (the worker runs inside the host's namespace)."""
    return int(Path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def host_tcp_retransmits() -> int:
    """TCP segments this host has retransmitted (its namespace's /proc/net/snmp)."""
    rows = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
    names, values = [r for r in rows if r[0] == "Tcp:"][:2]
    return int(values[names.index("RetransSegs")])


def host_link_drops() -> tuple[int, int]:
    """(dropped, overlimits) packets of this host's eth0 qdisc (the tbf shaping what it sends)."""
    try:
        out = subprocess.run(
            ["tc", "-s", "-j", "qdisc", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        qdiscs = json.loads(out or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0, 0
    return (
        sum(int(q.get("drops", 0)) for q in qdiscs),
        sum(int(q.get("overlimits", 0)) for q in qdiscs),
    )


def cpu_and_wait_s() -> tuple[float, float]:
    """This process's CPU time and time spent runnable but waiting for a core (``run_delay``
    of ``/proc/self/schedstat``), in seconds."""
    try:
        run, wait = Path("/proc/self/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(run) / 1e9, int(wait) / 1e9


def worker(reps: int, methods: list[str]) -> None:
    """One rank: time every method ``reps`` times; rank 0 prints the results as one JSON line."""
    import numpy as np
    from _support.spinning import create_spinning_two_dimensional
    from allreduce import GradSet, resnet50_shapes
    from mpi4py import MPI

    from mnify.runtime.communicators import choose_auto, create_communicator

    world = MPI.COMM_WORLD
    shapes = resnet50_shapes()
    auto = choose_auto(world)
    comms = {}
    # "two_dimensional@8": window 8; "two_dimensional@8s": and spinning; "two_dimensional+fp16":
    # shares cross hosts as float16 (inter_host_dtype)
    for name in methods:
        kind, _, setting = name.partition("@")
        narrow = None
        if kind.endswith(FP16):
            kind, narrow = kind[: -len(FP16)], np.float16
        if setting.endswith("s"):
            if kind != "two_dimensional":
                raise SystemExit(f"{name}: only two_dimensional has a spinning variant")
            comms[name] = create_spinning_two_dimensional(inter_host_dtype=narrow)
        else:
            comms[name] = create_communicator(kind, inter_host_dtype=narrow)
        if setting:
            comms[name].window = int(setting.rstrip("s"))  # type: ignore[attr-defined]
    models = {name: GradSet(shapes, world.Get_rank()) for name in methods}
    leader = next(iter(comms.values())).intra_rank == 0
    times: dict[str, list[float]] = {name: [] for name in methods}
    # per method, per rep: bytes sent, TCP retransmits, tbf drops, tbf overlimits (this host)
    counts: dict[str, list[list[int]]] = {name: [] for name in methods}
    spans: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}  # wall clock
    # per rep, summed over ranks: CPU seconds used and seconds spent waiting for a core
    sched: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}

    def counters() -> list[int]:
        if not leader:
            return [0, 0, 0, 0]
        return [host_bytes_sent(), host_tcp_retransmits(), *host_link_drops()]

    def once(name: str) -> tuple[float, list[int]]:
        world.Barrier()
        before = counters()
        cpu0, wait0 = cpu_and_wait_s()
        wall = time.time()
        start = time.perf_counter()
        comms[name].multi_node_mean_grad(models[name])
        took = time.perf_counter() - start
        cpu1, wait1 = cpu_and_wait_s()
        spans[name].append((wall, wall + took))
        used = world.allreduce(np.array([cpu1 - cpu0, wait1 - wait0]), op=MPI.SUM)
        world.Barrier()
        after = counters()
        slowest = float(world.allreduce(took, op=MPI.MAX))
        return slowest, [a - b for a, b in zip(after, before, strict=True)], used

    for name in methods:  # warm-up: connections, bucket plans, buffers
        once(name)
    for _ in range(reps):
        for name in methods:
            took, delta, used = once(name)
            sched[name].append((float(used[0]), float(used[1])))
            times[name].append(took)
            counts[name].append(delta)
    mine = (next(iter(comms.values())).host_name, counts) if leader else None
    per_host = [p for p in world.gather(mine, root=0) or [] if p is not None]
    if world.Get_rank() == 0:
        floats = sum(int(np.prod(s)) for _, s in shapes)
        result = {
            "arrays": len(shapes),
            "floats": floats,
            "grad_bytes": floats * 4,
            "auto": auto,
            "times": times,
            "bytes": {h: {m: int(np.median([r[0] for r in c[m]])) for m in c} for h, c in per_host},
            "retransmits": {h: {m: sum(r[1] for r in c[m]) for m in c} for h, c in per_host},
            "drops": {h: {m: sum(r[2] for r in c[m]) for m in c} for h, c in per_host},
            "overlimits": {h: {m: sum(r[3] for r in c[m]) for m in c} for h, c in per_host},
            "per_rep": {h: c for h, c in per_host},
            "spans": spans,
            "sched": sched,
        }
        print("BENCH " + json.dumps(result), flush=True)
    for comm in comms.values():
        comm.finalize()


class Sampler:
    """Every ``interval`` seconds, per host: the backlog of its link's shaper (bytes queued in
    the tbf of its eth0, what it sends) and the round-trip time and retransmissions TCP reports
    for its connections to other hosts (``ss -tin``), with the wall-clock time; run from the
    root namespace with ``ip netns exec``."""

    def __init__(self, bed: Any, interval: float) -> None:
        import threading

        self.bed, self.interval = bed, interval
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for host in self.bed.hosts:
                try:
                    self.samples.append({"host": host.name, "t": time.time(), **self._one(host)})
                except (OSError, ValueError, subprocess.TimeoutExpired):
                    pass

    @staticmethod
    def _one(host: Any) -> dict[str, Any]:
        ns = ["ip", "netns", "exec", host.netns]
        tc = subprocess.run(
            [*ns, "tc", "-s", "-j", "qdisc", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
        backlog = sum(int(q.get("backlog", 0)) for q in json.loads(tc or "[]"))
        ss = subprocess.run(
            [*ns, "ss", "-tin", "state", "established"], capture_output=True, text=True, timeout=5
        ).stdout
        rtts: list[float] = []
        unacked = 0
        lines = ss.splitlines()
        for head, info in zip(lines, lines[1:], strict=False):
            fields = head.split()
            if (
                len(fields) < 4
                or not fields[-2].startswith("10.")
                or not fields[-1].startswith("10.")
            ):
                continue
            if fields[-2].rsplit(":", 1)[0] == fields[-1].rsplit(":", 1)[0]:
                continue  # same host (loopback)
            found = re.search(r"\brtt:([0-9.]+)", info)
            if found and int(fields[1] or 0) > 0:  # only connections with data in flight
                rtts.append(float(found.group(1)))
            unacked += int(fields[1] or 0)
        return {"backlog": backlog, "rtt": max(rtts, default=0.0), "sendq": unacked}


def per_method_samples(
    samples: list[dict[str, Any]], spans: dict[str, list[list[float]]]
) -> dict[str, dict[str, float]]:
    """Each method's samples (those taken while one of its reps ran): median and max of the
    shaper backlog (KB) and of the largest RTT (ms)."""
    import statistics

    out: dict[str, dict[str, float]] = {}
    for method, reps in spans.items():
        inside = [x for x in samples if any(a <= x["t"] <= b for a, b in reps)]
        if not inside:
            continue
        backlog = [x["backlog"] / 1e3 for x in inside]
        rtt = [x["rtt"] for x in inside]
        out[method] = {
            "n": len(inside),
            "backlog_med": statistics.median(backlog),
            "backlog_max": max(backlog),
            "rtt_med": statistics.median(rtt),
            "rtt_max": max(rtt),
        }
    return out


def drive(
    rate: str,
    reps: int,
    slots: list[int],
    map_by: str,
    shm: bool,
    mpi_args: list[str],
    methods: list[str],
    timeout: float,
    sample: float,
) -> None:
    from testkit.testbed import testbed

    load_before = load_average()
    with testbed(len(slots)) as bed:
        bed.intra_host_shm = shm
        if rate != "none":
            bed.limit_rate(rate)
        sampler = Sampler(bed, sample) if sample > 0 else None
        with sampler or contextlib.nullcontext():
            run = bed.run(
                slots,
                Path(__file__),
                ["--worker", "--reps", str(reps), "--methods", *methods],
                timeout=timeout,
                check=False,
                mpiexec_args=["--map-by", map_by, *mpi_args],
            )
    load_after = load_average()
    lines = [line for line in run.rank_lines(0) if line.startswith("BENCH ")]
    if not lines:
        raise SystemExit(f"no result from rank 0 (load {load_after})\n{run.describe()}")
    result = json.loads(lines[0][len("BENCH ") :])
    times = result["times"]
    best = {m: min(times[m]) for m in methods}
    median = {m: float(sorted(times[m])[len(times[m]) // 2]) for m in methods}
    hosts = sorted(result["bytes"])
    floor = link_floor_s(result["grad_bytes"], len(slots), rate)
    print(
        f"ResNet-50 gradients: {result['arrays']} float32 arrays, {result['floats']:,} floats "
        f"({result['grad_bytes'] / 1e6:.1f} MB); hosts {', '.join(hosts)} with slots "
        f"{slots} (ranks mapped by {map_by}; same-host ranks over "
        f"{'shared memory' if shm else 'TCP'}); links limited to {rate} each way; "
        f"best and median of {reps} reps{'; ' + ' '.join(mpi_args) if mpi_args else ''}"
    )
    print(
        f"load average (1/5/15 min) before {load_before}, after {load_after}; link floor "
        + (f"{floor:.3f} s" if floor is not None else "none (no rate limit)")
    )
    header = f"{'method':<19}{'best s':>8}{'median s':>10}{'med/floor':>10}"
    for h in hosts:
        header += f"{'MB ' + h:>10}{'resent ' + h:>11}{'drops ' + h:>10}"
    print(header)
    for m in methods:
        its_floor = None if floor is None else floor / (2 if FP16 in m else 1)
        ratio = f"{median[m] / its_floor:9.2f}x" if its_floor else f"{'-':>10}"
        row = f"{m + (' *' if m == result['auto'] else ''):<19}{best[m]:8.3f}{median[m]:10.3f}"
        row += ratio
        for h in hosts:
            row += f"{result['bytes'][h][m] / 1e6:10.1f}{result['retransmits'][h][m]:11d}"
            row += f"{result['drops'][h][m]:10d}"
        print(row)
    print(
        "* what auto picks here; MB: median per call; resent: TCP segments retransmitted, "
        "drops: packets dropped by the host's tbf, both over all reps"
    )
    for m in methods:
        print(f"{m} reps: " + " ".join(f"{t:.2f}" for t in times[m]))
    print("per rep, summed over ranks: CPU s used / s runnable but waiting for a core")
    for m in methods:
        print(f"  {m}: " + " ".join(f"{c:.2f}/{w:.2f}" for c, w in result["sched"][m]))
    if sampler is not None:
        found = per_method_samples(sampler.samples, result["spans"])
        print(
            f"sampled every {sample} s (ss -tin, tc -s qdisc in each host): "
            "shaper backlog KB median/max, largest RTT of a busy connection ms median/max"
        )
        for m, v in found.items():
            print(
                f"  {m:<19} n={int(v['n']):3d} backlog {v['backlog_med']:7.0f} / "
                f"{v['backlog_max']:7.0f}  rtt {v['rtt_med']:7.1f} / {v['rtt_max']:7.1f}"
            )
    picked = result["auto"]
    if floor is not None and picked in median:
        ratio_auto = median[picked] / floor
        verdict = "met" if ratio_auto <= GOAL else "MISSED"
        print(
            f"goal: auto ({picked}) median within {GOAL}x of the link floor: "
            f"{ratio_auto:.2f}x ({verdict}); load after {load_after}"
        )
    elif floor is not None:
        print(f"auto picks {picked}, which this launch did not time")
    if run.timed_out or run.returncode != 0:
        print(f"(the launch ended with {'a timeout' if run.timed_out else run.returncode})")


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
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        help=f"what to time, of {', '.join(METHODS)}; two_dimensional@W: with window W; "
        "two_dimensional@Ws: and waits spinning in MPI_Waitall (bench/_support/spinning.py); "
        f"two_dimensional{FP16}: shares cross hosts as float16 (its floor is half)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds before the launch is killed"
    )
    parser.add_argument(
        "--sample",
        type=float,
        default=0.0,
        help="every this many seconds, sample each host's shaper backlog and TCP RTTs",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.reps, args.methods)
    else:
        timeout = args.timeout or 60 + args.reps * 30 * len(args.methods)
        drive(
            args.rate,
            args.reps,
            args.slots,
            args.map_by,
            args.shm,
            shlex.split(args.mpi_args),
            args.methods,
            timeout,
            args.sample,
        )


if __name__ == "__main__":
    main()
