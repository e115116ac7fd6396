"""The verdict on a job, in words for the terminal and as data for ``--summary-json``.

The words start with ``mnify run: the job failed (exit status N): CATEGORY: culprits...`` and
show one traceback per group of ranks, what mpiexec said, and the hint. The data follows the
schema in docs/design.md (§2)::

    {"schema": 1, "exit_status": int, "category": str, "culprit_ranks": [int],
     "errors": [{"type": str, "message": str, "ranks": [int], "hosts": [str]}], "hint": str}

plus ``headline``, ``consequences`` (errors that followed the cause, same shape), ``exits``
(mpiexec's reports: ``{"rank", "how", "code"}``) and ``waiting_ranks`` (ranks left waiting by
a rank that exited).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mnify.launch.diagnosis import Diagnosis
from mnify.launch.error_groups import ErrorGroup
from mnify.launch.launcher_messages import describe_exit
from mnify.runtime.errors import format_ranks

SCHEMA = 1


def describe_ranks(ranks: Sequence[int], nprocs: int) -> str:
    """``"ranks 0-2 (all 3)"``, ``"rank 1 (of 3)"``."""
    word = "rank" if len(ranks) == 1 else "ranks"
    scope = (
        f"all {nprocs}" if set(ranks) >= set(range(nprocs)) and len(ranks) > 1 else f"of {nprocs}"
    )
    return f"{word} {format_ranks(ranks)} ({scope})"


def _section(group: ErrorGroup, nprocs: int, consequence: bool) -> list[str]:
    hosts = f" on host {', '.join(group.hosts)}" if group.hosts else ""
    what = "collective timeout" if group.timed_out is not None else "error"
    after = " (a consequence)" if consequence else ""
    return ["", f"── {what} on {describe_ranks(group.ranks, nprocs)}{hosts}{after} ──", group.text]


def render_text(diagnosis: Diagnosis) -> str:
    """What a failed job prints after the ranks' own output."""
    d = diagnosis
    out = [
        f"mnify run: the job failed (exit status {d.exit_status}): {d.category.value}: {d.headline}"
    ]
    for group in d.errors:
        out += _section(group, d.nprocs, consequence=False)
    for group in d.consequences:
        out += _section(group, d.nprocs, consequence=True)
    if d.exits:
        out += ["", f"mpiexec: {'; '.join(describe_exit(e) for e in d.exits)}"]
    out += ["", f"hint: {d.hint}"]
    return "\n".join(out)


def _error_data(group: ErrorGroup) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": group.error_type,
        "message": group.message,
        "ranks": group.ranks,
        "hosts": group.hosts,
    }
    if group.timed_out is not None:
        data["missing_ranks"] = group.timed_out.missing
    return data


def as_data(diagnosis: Diagnosis) -> dict[str, Any]:
    """The verdict as JSON-ready data (see the module docstring)."""
    d = diagnosis
    return {
        "schema": SCHEMA,
        "exit_status": d.exit_status,
        "category": d.category.value,
        "culprit_ranks": d.culprit_ranks,
        "errors": [_error_data(g) for g in d.errors],
        "hint": d.hint,
        "headline": d.headline,
        "consequences": [_error_data(g) for g in d.consequences],
        "exits": [{"rank": e.rank, "how": e.how, "code": e.code} for e in d.exits],
        "waiting_ranks": d.stranded.waiting if d.stranded is not None else [],
    }


def write_json(path: str | os.PathLike[str], diagnosis: Diagnosis) -> None:
    """Write the verdict to ``path`` whole (through a temporary file and a rename)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp{os.getpid()}")
    temporary.write_text(json.dumps(as_data(diagnosis), indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, target)
