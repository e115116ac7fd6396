"""Where each rank's step goes, from a merged timeline: ``mnify scale``'s and ``mnify run
--timeline``'s one account of a step.

A step is the time from one optimizer update's start to the next one's on a rank (``step``
events where ``mnify scale`` recorded them, else the timeline's ``update`` events). Within it:

- ``mean_grad``: the collectives themselves (their time on the rank, less the wait below);
- ``wait``: waiting for other ranks inside collectives (the last rank's arrival minus this
  rank's, at most the collective's own time; complete collectives only);
- ``data``: the iterators' ``next`` (less any collective inside it);
- ``rank0_only``: rank-0-guarded blocks, and extensions that no other rank ran (less any
  collective inside them);
- ``compute``: the rest (forward, backward, the optimizer, extensions every rank runs, the
  script's own code).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mnify.launch.stragglers import collectives

PARTS = ("compute", "mean_grad", "wait", "data", "rank0_only")
GRADIENT_COLLECTIVES = frozenset({"multi_node_mean_grad", "allreduce_grad"})


@dataclass
class Breakdown:
    """Milliseconds per step, by part (see the module docstring)."""

    compute: float = 0.0
    mean_grad: float = 0.0
    wait: float = 0.0
    data: float = 0.0
    rank0_only: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {p: round(getattr(self, p), 3) for p in PARTS}

    @property
    def total(self) -> float:
        return sum(getattr(self, p) for p in PARTS)


@dataclass
class Attribution:
    """The measured steps of a job."""

    steps: list[int]  # the steps measured (update indices)
    step_ms: list[float]  # per measured step: its length, averaged over ranks
    per_rank: dict[int, Breakdown]  # mean over the measured steps
    examples_per_step: float | None  # every rank's batch together; None: no iterator seen
    batch_per_rank: dict[int, float] = field(default_factory=dict)
    gradient_bytes: int = 0  # one rank's gradients, as one mean-grad carries them
    gradient_ms: float = 0.0  # a mean-grad's time less its wait, per step, over ranks
    collective_steps: list[int] = field(default_factory=list)  # their step numbers (stragglers)
    on_gpu: bool = False

    @property
    def mean(self) -> Breakdown:
        """The breakdown averaged over ranks."""
        n = max(1, len(self.per_rank))
        return Breakdown(
            **{p: sum(getattr(b, p) for b in self.per_rank.values()) / n for p in PARTS}
        )


def _x(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]


def step_starts(trace: dict[str, Any]) -> dict[int, dict[int, float]]:
    """Per rank, per update index: when the update began (ms)."""
    events = _x(trace)
    starts: dict[int, dict[int, float]] = defaultdict(dict)
    if any(e.get("cat") == "step" for e in events):
        for e in events:
            if e.get("cat") == "step":
                index = int(e["args"]["seq"])
                mine = starts[int(e["pid"])]
                mine[index] = min(mine.get(index, float("inf")), float(e["ts"]) / 1e3)
        return starts
    for e in events:  # mnify run --timeline: the multi-node optimizer's updates, from 1
        args = e.get("args") or {}
        if e.get("cat") == "update" and not args.get("skipped"):
            starts[int(e["pid"])][int(args.get("step", 0)) + 1] = float(e["ts"]) / 1e3
    return starts


def _exclusive(span: tuple[float, float], inner: list[tuple[float, float]]) -> float:
    """``span``'s length less the collectives inside it."""
    a, b = span
    return max(0.0, (b - a) - sum(min(b, y) - max(a, x) for x, y in inner if x < b and y > a))


def attribute(
    trace: dict[str, Any], first: int | None = None, last: int | None = None
) -> Attribution:
    """The breakdown of updates ``first..last`` (default: all but the last one seen)."""
    starts = step_starts(trace)
    ranks = sorted(starts)
    common = set.intersection(*(set(s) for s in starts.values())) if starts else set()
    # a step is measured when every rank saw it begin and the next one begin
    measured = sorted(
        k
        for k in common
        if k + 1 in common and (first is None or k >= first) and (last is None or k <= last)
    )
    windows = {r: [(starts[r][k], starts[r][k + 1]) for k in measured] for r in ranks}

    def window_of(rank: int, ts: float) -> int | None:
        for i, (a, b) in enumerate(windows.get(rank, [])):
            if a <= ts < b:
                return i
        return None

    # waits at complete collectives, by (rank, arrival)
    waits: dict[tuple[int, float], float] = {}
    for group in collectives(trace):
        latest = max(a.ts_ms for a in group)
        for a in group:
            waits[(a.rank, a.ts_ms)] = latest - a.ts_ms
    events = _x(trace)
    extension_ranks: dict[str, set[int]] = defaultdict(set)
    for e in events:
        if e.get("cat") == "extension":
            extension_ranks[str(e["name"])].add(int(e["pid"]))
    n = len(measured)
    parts: dict[int, list[Breakdown]] = {r: [Breakdown() for _ in range(n)] for r in ranks}
    inner: dict[int, list[tuple[float, float]]] = defaultdict(list)
    gradient_bytes: list[int] = []
    gradient_ms = 0.0
    collective_steps: set[int] = set()
    on_gpu = False
    for e in events:
        cat, rank = e.get("cat"), int(e["pid"])
        if cat == "gpu":
            on_gpu = True
        if cat != "collective":
            continue
        ts, dur = float(e["ts"]) / 1e3, float(e["dur"]) / 1e3
        inner[rank].append((ts, ts + dur))
        i = window_of(rank, ts)
        if i is None:
            continue
        collective_steps.add(int((e.get("args") or {}).get("step", 0)))
        wait = min(dur, max(0.0, waits.get((rank, ts), 0.0)))
        parts[rank][i].wait += wait
        parts[rank][i].mean_grad += dur - wait
        if e["name"] in GRADIENT_COLLECTIVES:
            gradient_ms += dur - wait
            if (e.get("args") or {}).get("bytes"):
                gradient_bytes.append(int(e["args"]["bytes"]))
    examples: dict[int, list[int]] = defaultdict(list)
    for e in events:
        cat, rank = e.get("cat"), int(e["pid"])
        if cat not in ("data", "rank0", "extension"):
            continue
        ts, dur = float(e["ts"]) / 1e3, float(e["dur"]) / 1e3
        i = window_of(rank, ts)
        if i is None:
            continue
        alone = _exclusive((ts, ts + dur), inner[rank])
        if cat == "data":
            parts[rank][i].data += alone
            got = (e.get("args") or {}).get("examples")
            if isinstance(got, int):
                examples[rank].append(got)
        elif cat == "rank0" or extension_ranks[str(e["name"])] == {rank} and len(ranks) > 1:
            parts[rank][i].rank0_only += alone
    step_ms: list[float] = []
    for i in range(n):
        lengths = []
        for r in ranks:
            begin, end = windows[r][i]
            p = parts[r][i]
            p.compute = max(0.0, (end - begin) - p.mean_grad - p.wait - p.data - p.rank0_only)
            lengths.append(end - begin)
        step_ms.append(statistics.fmean(lengths))
    per_rank = {r: _mean(parts[r]) for r in ranks}
    batch = {r: statistics.median(v) for r, v in examples.items() if v}
    return Attribution(
        steps=measured,
        step_ms=step_ms,
        per_rank=per_rank,
        examples_per_step=sum(batch.values()) if len(batch) == len(ranks) and batch else None,
        batch_per_rank=batch,
        gradient_bytes=int(statistics.median(gradient_bytes)) if gradient_bytes else 0,
        gradient_ms=gradient_ms / max(1, n * len(ranks)),
        collective_steps=sorted(collective_steps),
        on_gpu=on_gpu,
    )


def _mean(items: Iterable[Breakdown]) -> Breakdown:
    items = list(items)
    if not items:
        return Breakdown()
    return Breakdown(**{p: statistics.fmean(getattr(b, p) for b in items) for p in PARTS})


def render(attribution: Attribution, prefix: str = "mnify timeline:") -> list[str]:
    """One line per rank: where its step goes."""
    lines = []
    for rank, b in sorted(attribution.per_rank.items()):
        total = b.total or 1.0
        shares = ", ".join(f"{p} {getattr(b, p):.1f} ms ({100 * getattr(b, p) / total:.0f}%)"
                           for p in PARTS)  # fmt: skip
        lines.append(f"{prefix} rank {rank} step {total:.1f} ms: {shares}")
    return lines
