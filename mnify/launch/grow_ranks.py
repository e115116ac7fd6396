"""``mnify run -n 2 --grow-ranks 4@30e,8@60e``: the phases of a job that grows its ranks.

Each phase is one mpiexec job of the script, unchanged. Phase ``k`` runs on its number of ranks,
resumes from phase ``k-1``'s global snapshot and, unless it is the last, stops at its milestone
writing its own (:mod:`mnify.runtime.phases` is the ranks' side). The launcher goes on to the
next phase only when the phase stopped at its milestone (its record is there) and exited 0; a
script that finishes before a milestone ends the job there. Slots: asking for more ranks than a
hostfile or ``--host`` offers is a usage error before anything starts; on one host without
either, any number is allowed (oversubscribed, as ``mnify run`` does there).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnify.runtime.phases import Milestone, record_path


@dataclass(frozen=True)
class Growth:
    """``ranks`` from ``milestone`` on."""

    ranks: int
    milestone: Milestone


@dataclass
class Phase:
    """One mpiexec job of the run: its ranks, where it stops (None: the last), its snapshots."""

    index: int
    ranks: int
    stop: Milestone | None
    snapshot: str | None  # written at ``stop``
    resume: str | None  # the previous phase's

    def record(self) -> dict[str, Any] | None:
        """What rank 0 wrote at the milestone (None: the phase did not stop there)."""
        if self.snapshot is None:
            return None
        try:
            data = json.loads(Path(record_path(self.snapshot)).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def parse(spec: str, first_ranks: int) -> list[Growth]:
    """``"4@30e,8@60e"`` -> growths; milestones increasing in the same unit, ranks growing."""
    growths = []
    for entry in spec.split(","):
        entry = entry.strip()
        ranks_text, at, milestone_text = entry.partition("@")
        if not at or not ranks_text.isdigit():
            raise ValueError(
                f"--grow-ranks: {entry!r} is not RANKS@MILESTONE (e.g. 4@30e: 4 ranks from epoch "
                "30; 8@500i: 8 ranks from iteration 500)"
            )
        growths.append(Growth(int(ranks_text), Milestone.parse(milestone_text)))
    previous_ranks, previous = first_ranks, None
    for g in growths:
        if g.ranks <= previous_ranks:
            raise ValueError(
                f"--grow-ranks: {g.ranks}@{g.milestone} does not grow the ranks (from "
                f"{previous_ranks})"
            )
        if previous is not None and (
            g.milestone.unit != previous.unit or g.milestone.value <= previous.value
        ):
            raise ValueError(
                f"--grow-ranks: milestones must increase in one unit; {g.milestone} follows "
                f"{previous}"
            )
        previous_ranks, previous = g.ranks, g.milestone
    return growths


def plan(first_ranks: int, growths: list[Growth], directory: str) -> list[Phase]:
    """The phases, with their snapshot paths under ``directory``."""
    sizes = [first_ranks, *(g.ranks for g in growths)]
    phases: list[Phase] = []
    for k, ranks in enumerate(sizes):
        last = k == len(growths)
        snapshot = None if last else os.path.join(directory, f"phase{k}.npz")
        resume = phases[-1].snapshot if phases else None
        stop = None if last else growths[k].milestone
        phases.append(Phase(k, ranks, stop, snapshot, resume))
    return phases


def as_data(phase: Phase, exit_status: int) -> dict[str, Any]:
    """``--summary-json``'s ``phases`` entry."""
    record = phase.record()
    return {
        "ranks": phase.ranks,
        "stop": None if phase.stop is None else str(phase.stop),
        "exit_status": exit_status,
        "stopped_at_iteration": None if record is None else record.get("iteration"),
        "global_batch": None if record is None else record.get("global_batch"),
        "snapshot": phase.snapshot if record is not None else None,
    }


def render(phases: list[dict[str, Any]]) -> list[str]:
    """The verdict's lines, one a phase."""
    lines = []
    for k, p in enumerate(phases):
        if p["stopped_at_iteration"] is not None:
            tail = (
                f"stopped at {p['stop']} (iteration {p['stopped_at_iteration']}, global batch "
                f"{p['global_batch']})"
            )
        elif p["exit_status"] == 0:
            tail = "ran to the end"
        else:
            tail = f"ended with exit status {p['exit_status']}"
        lines.append(f"mnify run: phase {k + 1}: {p['ranks']} ranks, {tail}")
    return lines
