"""Which rank keeps the others waiting: arrival times at collectives, from a merged timeline.

A rank's *lateness* at a collective is its arrival (the collective's start on that rank, on
rank 0's clock) minus the median arrival of the collective's other ranks. Only complete
collectives count: every rank of the communicator recorded them (a rank missing from the trace,
a ring that overwrote old events, a job that died mid-way leave incomplete ones), and only
collectives of two ranks or more. A rank is named a straggler when

- it took part in at least :data:`MIN_COLLECTIVES` complete collectives,
- it arrived last at :data:`LAST_FRACTION` of them or more, and
- its mean lateness is at least ``max(MIN_LATE_MS, STEP_FRACTION * median step time)``.

The median step time is the median gap between the starts of consecutive optimizer updates of
a rank, over all ranks; without updates only the 5 ms floor applies. On a quiet job the last
rank changes from one collective to the next and lateness averages out near zero, so nobody is
named; one slow rank is last nearly every time, late by about what it is slower.

The waiting time a rank spends at a collective is the last arrival minus its own: what
``mnify timeline --plot`` draws per step.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

MIN_COLLECTIVES = 20
LAST_FRACTION = 0.5
MIN_LATE_MS = 5.0
STEP_FRACTION = 0.05


@dataclass(frozen=True)
class Arrival:
    rank: int
    ts_ms: float
    step: int


@dataclass(frozen=True)
class RankLateness:
    """One rank over the complete collectives it took part in."""

    rank: int
    collectives: int
    last: int  # how often it arrived last
    mean_late_ms: float
    waited_ms: float  # in all, for the last rank of each collective to arrive

    @property
    def late_fraction(self) -> float:
        return self.last / self.collectives if self.collectives else 0.0


@dataclass
class Report:
    ranks: list[RankLateness]
    stragglers: list[RankLateness]
    collectives: int  # complete collectives compared
    median_step_ms: float | None
    threshold_ms: float
    steps: int


def _mnify_info(trace: dict[str, Any]) -> dict[str, Any]:
    other = trace.get("otherData")
    info = other.get("mnify") if isinstance(other, dict) else None
    return info if isinstance(info, dict) else {}


def collectives(trace: dict[str, Any]) -> list[list[Arrival]]:
    """The complete collectives of ``trace``: per collective, every rank's arrival."""
    sizes = {
        key: int(c.get("size", 0))
        for key, c in _mnify_info(trace).get("communicators", {}).items()
        if isinstance(c, dict)
    }
    groups: dict[tuple[str, int], list[Arrival]] = defaultdict(list)
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("cat") != "collective":
            continue
        args = ev.get("args") or {}
        comm, seq = args.get("comm"), args.get("seq")
        if comm is None or seq is None:
            continue
        groups[(str(comm), int(seq))].append(
            Arrival(int(ev["pid"]), float(ev["ts"]) / 1e3, int(args.get("step", 0)))
        )
    complete = []
    for (comm, _), arrivals in groups.items():
        size = sizes.get(comm, 0)
        if size >= 2 and len(arrivals) == size and len({a.rank for a in arrivals}) == size:
            complete.append(arrivals)
    complete.sort(key=lambda group: min(a.ts_ms for a in group))
    return complete


def median_step_ms(trace: dict[str, Any]) -> float | None:
    """The median gap between consecutive updates' starts on a rank, over all ranks."""
    starts: dict[int, list[float]] = defaultdict(list)
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") == "update":
            if not (ev.get("args") or {}).get("skipped"):
                starts[int(ev["pid"])].append(float(ev["ts"]) / 1e3)
    gaps = []
    for ts in starts.values():
        ts.sort()
        gaps += [b - a for a, b in zip(ts, ts[1:], strict=False)]
    return statistics.median(gaps) if gaps else None


def analyze(trace: dict[str, Any]) -> Report:
    """Lateness of every rank, and the stragglers (see the module docstring)."""
    groups = collectives(trace)
    late: dict[int, list[float]] = defaultdict(list)
    last: dict[int, int] = defaultdict(int)
    waited: dict[int, float] = defaultdict(float)
    steps: set[int] = set()
    for arrivals in groups:
        latest = max(arrivals, key=lambda a: a.ts_ms)
        last[latest.rank] += 1
        for a in arrivals:
            others = [b.ts_ms for b in arrivals if b is not a]
            late[a.rank].append(a.ts_ms - statistics.median(others))
            waited[a.rank] += latest.ts_ms - a.ts_ms
            steps.add(a.step)
    step = median_step_ms(trace)
    threshold = max(MIN_LATE_MS, STEP_FRACTION * step) if step is not None else MIN_LATE_MS
    ranks = [
        RankLateness(r, len(values), last[r], statistics.fmean(values), waited[r])
        for r, values in sorted(late.items())
    ]
    named = [
        r
        for r in ranks
        if r.collectives >= MIN_COLLECTIVES
        and r.late_fraction >= LAST_FRACTION
        and r.mean_late_ms >= threshold
    ]
    return Report(ranks, named, len(groups), step, threshold, len(steps))


def waiting_per_step(trace: dict[str, Any]) -> dict[int, dict[int, float]]:
    """Per rank, per step: milliseconds spent waiting for the last rank at collectives."""
    out: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for arrivals in collectives(trace):
        latest = max(a.ts_ms for a in arrivals)
        for a in arrivals:
            out[a.rank][a.step] += latest - a.ts_ms
    return {rank: dict(per_step) for rank, per_step in out.items()}


def straggler_line(s: RankLateness, prefix: str = "mnify run") -> str:
    return (
        f"{prefix}: straggler: rank {s.rank} arrived last at {100 * s.late_fraction:.0f}% "
        f"of collectives, {s.mean_late_ms:.1f} ms late on average"
    )


def as_data(report: Report) -> list[dict[str, Any]]:
    """``--summary-json``'s ``stragglers``: the named ranks only."""
    return [
        {
            "rank": s.rank,
            "late_fraction": round(s.late_fraction, 4),
            "mean_late_ms": round(s.mean_late_ms, 3),
        }
        for s in report.stragglers
    ]


def render(report: Report, prefix: str = "mnify timeline") -> list[str]:
    """The report as a short table and the straggler lines."""
    step = f"median step {report.median_step_ms:.1f} ms" if report.median_step_ms else "no steps"
    lines = [
        f"{len(report.ranks)} ranks, {report.collectives} complete collectives over "
        f"{report.steps} steps, {step}; named late from {report.threshold_ms:.1f} ms on average"
    ]
    if report.ranks:
        lines.append(
            f"{'rank':>6} {'collectives':>11} {'last':>6} {'mean late':>11} {'waited':>11}"
        )
        for r in report.ranks:
            lines.append(
                f"{r.rank:>6} {r.collectives:>11} {100 * r.late_fraction:>5.0f}% "
                f"{r.mean_late_ms:>8.1f} ms {r.waited_ms:>8.1f} ms"
            )
    lines += [straggler_line(s, prefix) for s in report.stragglers]
    if not report.stragglers:
        lines.append(f"{prefix}: no straggler")
    return lines
