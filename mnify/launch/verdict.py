"""The failure summary in words: one traceback per group of ranks, what mpiexec said, the hint."""

from __future__ import annotations

from collections.abc import Sequence

from mnify.launch.failures import FailureSummary
from mnify.launch.launcher_messages import describe_exit
from mnify.runtime.errors import format_ranks


def describe_ranks(ranks: Sequence[int], nprocs: int) -> str:
    """``"ranks 0-2 (all 3)"``, ``"rank 1 (of 3)"``."""
    word = "rank" if len(ranks) == 1 else "ranks"
    scope = (
        f"all {nprocs}" if set(ranks) >= set(range(nprocs)) and len(ranks) > 1 else f"of {nprocs}"
    )
    return f"{word} {format_ranks(ranks)} ({scope})"


def render_summary(summary: FailureSummary) -> str:
    """The text printed after a failed job: one traceback per group, then the hint."""
    out = [f"mnify run: the job failed (exit status {summary.returncode}): {summary.kind.value}"]
    for group in summary.errors + summary.timeouts:
        hosts = f" on host {', '.join(sorted(group.hosts))}" if group.hosts else ""
        out.append("")
        what = "collective timeout" if group.timeout else "error"
        out.append(f"── {what} on {describe_ranks(group.ranks, summary.nprocs)}{hosts} ──")
        out.append(group.text)
    if summary.exits:
        out.append("")
        out.append(f"mpiexec: {'; '.join(describe_exit(e) for e in summary.exits)}")
    out.append("")
    out.append(f"hint: {summary.hint}")
    return "\n".join(out)
