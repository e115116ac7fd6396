"""Reading a failed job: group the ranks' tracebacks and say what kind of failure it is.

The advice of people who debugged ChainerMN jobs, applied for the user:

- the same error as many times as there are ranks does not depend on the rank or GPU id: debug it
  on one rank;
- an error on some ranks only depends on the rank (its data shard, its device id, rank-0-only code);
- a communication failure (a watchdog :class:`~mnify.runtime.errors.CollectiveTimeout`, an MPI
  abort without a Python error, a rank killed by a signal): retry on one rank; if the error
  disappears there, it is in the communication.

Tracebacks are cut out of each rank's stderr by :mod:`~mnify.launch.rank_reports` while the job
runs, then :func:`summarize` groups identical ones; :mod:`~mnify.launch.verdict` prints one per
group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from mnify.launch.launcher_messages import RankExit, parse_launcher_messages, who_ended
from mnify.launch.rank_reports import COLLECTIVE_TIMEOUT, RankTraceback
from mnify.runtime.errors import format_ranks

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


class FailureKind(Enum):
    SAME_ON_EVERY_RANK = "same error on every rank"
    SOME_RANKS = "error on some ranks only"
    DIFFERS_BY_RANK = "different errors on different ranks"
    COMMUNICATION = "communication failure"
    NO_TRACEBACK = "failed without a Python traceback"


@dataclass
class ErrorGroup:
    """Identical tracebacks from several ranks, shown once."""

    ranks: list[int]
    text: str
    exception_line: str
    hosts: list[str] = field(default_factory=list)
    timeout: bool = False


@dataclass
class FailureSummary:
    nprocs: int
    returncode: int
    kind: FailureKind
    errors: list[ErrorGroup]  # the user's errors (or the timeouts, for a communication failure)
    timeouts: list[ErrorGroup]  # watchdog timeouts that followed a user's error
    exits: list[RankExit]
    hint: str


_TIMEOUT_RANK = re.compile(r"( timed out after \S+ s) on rank \d+:")


def _group_key(tb: RankTraceback) -> str:
    """What must match for two tracebacks to count as the same: memory addresses aside, and for
    watchdog timeouts the waiting rank aside (every waiting rank names itself)."""
    return _TIMEOUT_RANK.sub(r"\1:", _ADDRESS.sub("0x…", tb.text))


def group_tracebacks(tracebacks: Iterable[RankTraceback]) -> list[ErrorGroup]:
    """Identical tracebacks (memory addresses aside) become one group listing their ranks."""
    groups: dict[str, ErrorGroup] = {}
    for tb in tracebacks:
        key = _group_key(tb)
        group = groups.get(key)
        if group is None:
            group = groups[key] = ErrorGroup(
                [], tb.text, tb.exception_line, timeout=bool(tb.timeout)
            )
        if tb.rank not in group.ranks:
            group.ranks.append(tb.rank)
        if tb.host and tb.host not in group.hosts:
            group.hosts.append(tb.host)
    for group in groups.values():
        group.ranks.sort()
    return sorted(groups.values(), key=lambda g: (-len(g.ranks), g.ranks[0]))


_FORK_WARNING = re.compile(r'involving a call to the\s+"fork\(\)" system call')
FORK_NOTE = (
    "Open MPI warned that a rank called fork() (subprocess, os.system, DumpGraph, a "
    "MultiprocessIterator started with 'fork'): over InfiniBand this can abort ranks with signal "
    "6 or corrupt memory. `mnify lint` finds these calls; `mnify doctor` names your MPI's risk."
)


def _signal_note(exits: Sequence[RankExit]) -> str:
    notes = []
    for e in exits:
        if e.how != "signal":
            continue
        name = f" ({e.detail})" if e.detail else ""
        note = f"{who_ended(e)} was killed by signal {e.code}{name}"
        if e.code == 9:
            note += ": often the host ran out of memory (check dmesg), or a scheduler limit"
        elif e.code == 6:
            note += (
                ": an abort inside a library; with Open MPI's fork() warning above, a subprocess, "
                "DumpGraph or a fork-started MultiprocessIterator is the usual cause"
            )
        elif e.code == 11:
            note += ": a crash in native code (CUDA, NCCL, MPI or a C extension)"
        notes.append(note)
    return "; ".join(notes)


def _one_rank_command(rerun: str | None) -> str:
    return f" (`{rerun}`)" if rerun else ""


def summarize(
    tracebacks: Sequence[RankTraceback],
    nprocs: int,
    returncode: int,
    launcher_text: str = "",
    rerun_one_rank: str | None = None,
) -> FailureSummary:
    """Classify a failed job from its tracebacks and mpiexec's messages, with the hint to show."""
    groups = group_tracebacks(tracebacks)
    errors = [g for g in groups if not g.timeout]
    timeouts = [g for g in groups if g.timeout]
    exits = parse_launcher_messages(launcher_text)
    every = set(range(nprocs))
    once = _one_rank_command(rerun_one_rank)
    if errors:
        failing = sorted({r for g in errors for r in g.ranks})
        if len(errors) == 1 and set(failing) >= every:
            kind = FailureKind.SAME_ON_EVERY_RANK
            hint = (
                f"the same error on all {nprocs} ranks: it does not depend on the rank or the GPU "
                f"id. Reproduce and debug it on one rank{once}; it is in the script, its data or "
                "its environment, not in the communication."
            )
        elif set(failing) >= every:
            kind = FailureKind.DIFFERS_BY_RANK
            hint = (
                f"every rank failed, but not in the same way ({len(errors)} different errors): "
                "the errors depend on the rank. Compare what differs between ranks: the data "
                "shard each one gets, the device id (use comm.intra_rank, not comm.rank, for the "
                "GPU), files or paths built from the rank."
            )
        else:
            kind = FailureKind.SOME_RANKS
            who = format_ranks(failing)
            plural = "s" if len(failing) > 1 else ""
            hint = (
                f"only rank{plural} {who} of {nprocs} reported an error: it depends on the rank "
                "(unless the others were stopped by the abort before they reached it). Look at "
                "what differs on that rank: its data shard (scatter_dataset), its device id "
                "(comm.intra_rank, set once), code under `if comm.rank == 0:`, files or paths "
                "built from the rank."
            )
        if timeouts:
            waiting = format_ranks(sorted({r for g in timeouts for r in g.ranks}))
            hint += (
                f" Rank(s) {waiting} then timed out in a collective waiting for the failed "
                "rank(s): a consequence, not the cause."
            )
    elif timeouts:
        kind = FailureKind.COMMUNICATION
        errors, timeouts = timeouts, []
        match = COLLECTIVE_TIMEOUT.search(errors[0].text)
        what = (
            f"collective {match.group('kind')} #{match.group('seq')} timed out waiting for "
            f"rank(s) {match.group('missing')}"
            if match
            else "a collective timed out"
        )
        hint = (
            f"a communication failure: {what}. Retry on one rank{once}: if the error disappears "
            "there, it is in the communication: ranks calling collectives in a different order "
            "or a different number of times (rank-0-only code, uneven data), a rank stuck in I/O "
            "or a hang, or the network between hosts. MNIFY_DEBUG=1 makes the ranks compare "
            "every collective before running it."
        )
    else:
        signal_note = _signal_note(exits)
        if signal_note or any(e.how == "abort" for e in exits):
            kind = FailureKind.COMMUNICATION
            cause = signal_note or "an MPI abort without a Python traceback"
            hint = (
                f"the job ended abnormally: {cause}. Retry on one rank{once}: if it disappears "
                "there, it is in the communication or in what running several ranks at once "
                "costs (memory, GPU sharing, fork() under MPI)."
            )
        else:
            kind = FailureKind.NO_TRACEBACK
            ended = [e for e in exits if e.how == "exit"]
            where = (
                f"{who_ended(ended[0])} exited with status {ended[0].code}"
                if ended
                else f"mpiexec exited with status {returncode}"
            )
            hint = (
                f"no Python traceback was printed; {where}. Look at the output above; retry on "
                f"one rank{once} to see whether it depends on running several ranks."
            )
    if _FORK_WARNING.search(launcher_text):
        hint += " " + FORK_NOTE
    return FailureSummary(nprocs, returncode, kind, errors, timeouts, exits, hint)
