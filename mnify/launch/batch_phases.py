"""The global batch of each step, read from a merged timeline: ``mnify run --timeline`` and
``mnify timeline`` say how the batch was split and grown.

With a global-batch iterator (docs/global_batch.md) every ``update`` event carries the step's
global batch, the rank's share and, when ``GrowBatch(max_per_rank=...)`` accumulated, the
micro-batches (:mod:`mnify.runtime.timeline`). Consecutive steps with the same global batch,
number of ranks and micro-batches form one phase; each phase is one line with the shares of its
last step (with ``split="speed"`` they move, so the last is the settled one).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchPhase:
    first_step: int
    last_step: int
    global_batch: int
    ranks: int
    micro_batches: int
    shares: tuple[int, ...]  # at the last step, by rank


def phases(trace: dict[str, Any]) -> list[BatchPhase]:
    """The phases of a trace's global-batch steps (empty for a job without one)."""
    steps: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for ev in trace.get("traceEvents", []):
        args = ev.get("args") or {}
        if ev.get("ph") == "X" and ev.get("cat") == "update" and "global_batch" in args:
            steps[int(args["step"])][int(ev["pid"])] = args
    found: list[BatchPhase] = []
    for step in sorted(steps):
        by_rank = steps[step]
        any_args = next(iter(by_rank.values()))
        key = (int(any_args["global_batch"]), len(by_rank), int(any_args.get("micro_batches", 1)))
        shares = tuple(int(by_rank[r].get("share", -1)) for r in sorted(by_rank))
        last = found[-1] if found else None
        if last is not None and (last.global_batch, last.ranks, last.micro_batches) == key:
            found[-1] = BatchPhase(last.first_step, step, *key, shares)
        else:
            found.append(BatchPhase(step, step, *key, shares))
    return found


def render(found: list[BatchPhase], say: str) -> list[str]:
    lines = []
    for p in found:
        steps = (
            f"step {p.first_step}"
            if p.first_step == p.last_step
            else (f"steps {p.first_step}-{p.last_step}")
        )
        accumulation = f", {p.micro_batches} micro-batches a step" if p.micro_batches > 1 else ""
        shares = "/".join(str(s) for s in p.shares)
        lines.append(
            f"{say} {steps}: global batch {p.global_batch} on {p.ranks} ranks (shares {shares}"
            f"{' at the last step' if p.first_step != p.last_step else ''}){accumulation}"
        )
    return lines
