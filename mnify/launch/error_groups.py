"""Identical tracebacks from several ranks become one group, shown once with its ranks.

Two tracebacks are the same when their text matches with memory addresses aside and, for the
watchdog's :class:`~mnify.runtime.errors.CollectiveTimeout`, the waiting rank aside (every
waiting rank names itself). Chainer's echo of a training-loop error is dropped for a rank that
also printed the full traceback: the two are one error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from mnify.launch.rank_reports import COLLECTIVE_TIMEOUT, RankTraceback

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_TIMEOUT_RANK = re.compile(r"( timed out after \S+ s) on rank \d+:")


@dataclass(frozen=True)
class TimedOut:
    """What a watchdog timeout says: the collective, and the ranks that never arrived."""

    kind: str
    seq: int
    seconds: float
    missing: list[int]  # empty when the waiting rank could not tell


@dataclass
class ErrorGroup:
    """One error and the ranks (and hosts) that printed it."""

    ranks: list[int]
    text: str  # the traceback, launcher frames dropped, runtime frames folded
    error_type: str  # "ValueError"; "" when the traceback has no exception line
    message: str
    hosts: list[str] = field(default_factory=list)
    timed_out: TimedOut | None = None


def parse_rank_list(text: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]`` (the inverse of ``format_ranks``)."""
    ranks: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            ranks += range(int(first), int(last or first) + 1)
    return ranks


def timed_out(tb: RankTraceback) -> TimedOut | None:
    match = COLLECTIVE_TIMEOUT.search(tb.text)
    if match is None:
        return None
    missing = match.group("missing")
    return TimedOut(
        match.group("kind"),
        int(match.group("seq")),
        float(match.group("timeout")),
        [] if missing == "unknown" else parse_rank_list(missing),
    )


def _group_key(tb: RankTraceback) -> str:
    return _TIMEOUT_RANK.sub(r"\1:", _ADDRESS.sub("0x…", tb.text))


def without_loop_echoes(tracebacks: Iterable[RankTraceback]) -> list[RankTraceback]:
    """Drop Chainer's partial echo of a rank that printed the full traceback as well."""
    tracebacks = list(tracebacks)
    complete = {tb.rank for tb in tracebacks if not tb.loop_echo}
    return [tb for tb in tracebacks if not (tb.loop_echo and tb.rank in complete)]


def group_tracebacks(tracebacks: Iterable[RankTraceback]) -> list[ErrorGroup]:
    """Identical tracebacks become one group listing their ranks; the largest group first."""
    groups: dict[str, ErrorGroup] = {}
    for tb in without_loop_echoes(tracebacks):
        key = _group_key(tb)
        group = groups.get(key)
        if group is None:
            group = groups[key] = ErrorGroup(
                [], tb.text, tb.error_type, tb.error_message, timed_out=timed_out(tb)
            )
        if tb.rank not in group.ranks:
            group.ranks.append(tb.rank)
        if tb.host and tb.host not in group.hosts:
            group.hosts.append(tb.host)
    for group in groups.values():
        group.ranks.sort()
        group.hosts.sort()
    return sorted(groups.values(), key=lambda g: (-len(g.ranks), g.ranks[0]))
