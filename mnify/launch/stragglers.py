"""Which rank keeps the others waiting: arrival times at collectives, from a merged timeline.

A rank's *lateness* at a collective is its arrival (the collective's start on that rank, on
rank 0's clock) minus the median arrival of the collective's other ranks; its lateness for a
*step* (an optimizer update: the collectives recorded with the same step number) is the sum
over the step's collectives. Judging per step, not per collective, is what finds a rank that
is late once a step: with synchronised BatchNorm a step has a dozen collectives, and a rank
that sleeps before one of them is last there only, by the whole sleep, and on time at the rest.
Only complete collectives count: every rank of the communicator recorded them (a rank missing
from the trace, a ring that overwrote old events, a job that died mid-way leave incomplete
ones), and only collectives of two ranks or more; a step counts when one of its collectives
does. A rank is named a straggler when

- it took part in at least :data:`MIN_STEPS` such steps,
- it was the latest rank (the largest lateness) of :data:`LAST_FRACTION` of them or more, and
- its mean lateness per step is at least ``max(MIN_LATE_MS, STEP_FRACTION * median step)``.

The median step time is the median gap between the starts of consecutive optimizer updates of
a rank, over all ranks. A job that records no optimizer update (a loop that all-reduces by hand,
the nnabla tutorial's style) has no steps to group by: there each complete collective is its
own step, and the median gap between a rank's consecutive collectives is the step time. On a quiet job the last
rank changes from one step to the next and lateness averages out near zero, so nobody is
named; one slow rank is last nearly every step, late by about what it is slower.

The waiting time a rank spends at a collective is the last arrival minus its own: what
``mnify timeline --plot`` draws per step.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

MIN_STEPS = 20
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
    """One rank over the steps whose complete collectives it took part in."""

    rank: int
    collectives: int  # complete collectives compared
    steps: int  # steps with at least one of them
    last: int  # how many of those steps it was the latest rank of
    mean_late_ms: float  # lateness per step, on average
    waited_ms: float  # in all, for the last rank of each collective to arrive

    @property
    def late_fraction(self) -> float:
        return self.last / self.steps if self.steps else 0.0


@dataclass
class Report:
    ranks: list[RankLateness]
    stragglers: list[RankLateness]
    collectives: int  # complete collectives compared
    median_step_ms: float | None
    threshold_ms: float
    steps: int  # steps compared


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


def median_collective_gap_ms(groups: list[list[Arrival]]) -> float | None:
    """The median gap between consecutive collectives' starts on a rank, over all ranks: the
    step time of a job without optimizer updates, where each collective is a step."""
    starts: dict[int, list[float]] = defaultdict(list)
    for arrivals in groups:
        for a in arrivals:
            starts[a.rank].append(a.ts_ms)
    gaps = []
    for ts in starts.values():
        ts.sort()
        gaps += [b - a for a, b in zip(ts, ts[1:], strict=False)]
    return statistics.median(gaps) if gaps else None


def analyze(
    trace: dict[str, Any],
    *,
    steps: Collection[int] | None = None,
    min_steps: int = MIN_STEPS,
) -> Report:
    """Lateness of every rank per step, and the stragglers (see the module docstring).

    ``steps``: only these step numbers are compared (``mnify scale`` leaves out its warm-up);
    ``min_steps``: how many a rank must have taken part in to be named.
    """
    groups = [g for g in collectives(trace) if steps is None or g[0].step in steps]
    step_ms = median_step_ms(trace)
    if step_ms is None and groups:
        # no optimizer update recorded: every collective is its own step
        step_ms = median_collective_gap_ms(groups)
        groups = [[Arrival(a.rank, a.ts_ms, k) for a in g] for k, g in enumerate(groups)]
    per_step: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    counted: dict[int, int] = defaultdict(int)
    waited: dict[int, float] = defaultdict(float)
    for arrivals in groups:
        latest = max(a.ts_ms for a in arrivals)
        step = arrivals[0].step
        for a in arrivals:
            others = [b.ts_ms for b in arrivals if b is not a]
            per_step[step][a.rank] += a.ts_ms - statistics.median(others)
            waited[a.rank] += latest - a.ts_ms
            counted[a.rank] += 1
    late: dict[int, list[float]] = defaultdict(list)
    last: dict[int, int] = defaultdict(int)
    for lateness in per_step.values():
        last[max(lateness, key=lambda r: lateness[r])] += 1
        for rank, ms in lateness.items():
            late[rank].append(ms)
    threshold = max(MIN_LATE_MS, STEP_FRACTION * step_ms) if step_ms is not None else MIN_LATE_MS
    ranks = [
        RankLateness(r, counted[r], len(values), last[r], statistics.fmean(values), waited[r])
        for r, values in sorted(late.items())
    ]
    named = [
        r
        for r in ranks
        if r.steps >= min_steps and r.late_fraction >= LAST_FRACTION and r.mean_late_ms >= threshold
    ]
    return Report(ranks, named, len(groups), step_ms, threshold, len(per_step))


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
        f"{prefix}: straggler: rank {s.rank} was the last rank at {100 * s.late_fraction:.0f}% "
        f"of steps, {s.mean_late_ms:.1f} ms late per step on average"
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
        f"{report.steps} steps, {step}; named late from {report.threshold_ms:.1f} ms a step"
    ]
    if report.ranks:
        lines.append(f"{'rank':>6} {'steps':>7} {'last':>6} {'late/step':>11} {'waited':>11}")
        for r in report.ranks:
            lines.append(
                f"{r.rank:>6} {r.steps:>7} {100 * r.late_fraction:>5.0f}% "
                f"{r.mean_late_ms:>8.1f} ms {r.waited_ms:>8.1f} ms"
            )
    lines += [straggler_line(s, prefix) for s in report.stragglers]
    if not report.stragglers:
        lines.append(f"{prefix}: no straggler")
    return lines
