"""The verdict on a job: one category per failure, the ranks that caused it, and what to do.

It decides from every rank's reports and the launcher's own facts together:

=================  ==================================================================
``ok``             the job succeeded
``same-error``     every rank failed with one error: it does not depend on the rank
``rank-dependent`` some ranks failed, ranks failed differently, or ``MNIFY_DEBUG`` found
                   ranks passing different shapes or collectives
``communication``  a collective timed out or a host's daemon was lost: the culprits are
                   the ranks that never arrived
``rank-exited``    a rank left (with its status) while the others went on or waited
``killed``         a rank died of a signal (out of memory, a crash in native code)
``launch``         mpiexec could not start the ranks (host names, ssh, the hostfile)
``interrupted``    ``mnify run`` was told to stop (Ctrl-C, SIGTERM, SIGHUP)
``stopped``        every rank stopped on purpose after the same update (``--verify``,
                   ``mnify scale``); the exit status is the one the stop asked for
=================  ==================================================================

When several apply, the first cause wins: ``interrupted`` (the user's word) > ``launch`` >
``killed`` > an error other than a timeout > ``rank-exited`` > ``communication``. A timeout
behind another cause is kept as its consequence.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from mnify.launch.early_exit import StrandedRanks
from mnify.launch.error_groups import ErrorGroup, group_tracebacks, parse_rank_list
from mnify.launch.launcher_messages import (
    RankExit,
    find_launch_problem,
    fork_warning,
    lost_daemon,
    parse_launcher_messages,
    who_ended,
)
from mnify.launch.rank_reports import RankExitReport, RankStopReport, RankTraceback
from mnify.runtime.errors import format_ranks


class Category(Enum):
    """The kind of outcome; the values are the names ``--summary-json`` uses."""

    OK = "ok"
    SAME_ERROR = "same-error"
    RANK_DEPENDENT = "rank-dependent"
    COMMUNICATION = "communication"
    RANK_EXITED = "rank-exited"
    KILLED = "killed"
    LAUNCH = "launch"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"


@dataclass
class JobFacts:
    """Everything known about a job once it has ended."""

    nprocs: int
    exit_status: int  # mpiexec's, as a shell reports it (128+N for a signal)
    tracebacks: Sequence[RankTraceback] = ()
    exit_reports: Sequence[RankExitReport] = ()
    launcher_text: str = ""  # mpiexec's own output and the ranks' MPI_ABORT banners
    stranded: StrandedRanks | None = None  # the launcher ended the job for this
    stopped_after_failure: bool = False  # a rank died and mpiexec outlived it: we ended it
    interrupted_by: int | None = None  # the signal that told ``mnify run`` to stop
    ranks_heard: frozenset[int] = frozenset()  # ranks that printed or published their state
    rerun_one_rank: str | None = None  # the command that runs the script on one rank
    debug: bool = False  # MNIFY_DEBUG was on
    stops: Sequence[RankStopReport] = ()  # ranks that stopped on purpose after an update
    left_early: StrandedRanks | None = None  # a rank left while others waited; ended otherwise
    launcher_outlived_ranks: bool = False  # mpiexec hung after its ranks; mnify run ended it
    launcher_signal: int | None = None  # mpiexec itself was killed by this signal
    vanished: Sequence[int] = ()  # ranks that died without a report of any kind
    exit_statuses: dict[int, int] = field(default_factory=dict)  # ranks that reached their end


@dataclass
class Diagnosis:
    category: Category
    exit_status: int
    nprocs: int
    culprit_ranks: list[int]  # empty only when unknown (or for ok / interrupted)
    headline: str  # the culprits and what they did, in a few words
    hint: str
    errors: list[ErrorGroup] = field(default_factory=list)  # the errors behind the category
    consequences: list[ErrorGroup] = field(default_factory=list)  # timeouts that followed
    exits: list[RankExit] = field(default_factory=list)  # what mpiexec said about rank endings
    stranded: StrandedRanks | None = None

    @property
    def ok(self) -> bool:
        return self.category is Category.OK


FORK_NOTE = (
    "Open MPI warned that a rank called fork() (subprocess, os.system, DumpGraph, a "
    "MultiprocessIterator started with 'fork'): over InfiniBand this can abort ranks with signal "
    "6 or corrupt memory. `mnify lint` finds these calls; `mnify doctor` names your MPI's risk."
)
_DEBUG_ADVICE = (
    "Run again with MNIFY_DEBUG=1 (`MNIFY_DEBUG=1 mnify run ...`): the ranks then compare the "
    "kind, shapes and dtypes of every collective first and name the ranks that differ."
)
# MPI errors that mean ranks passed buffers of different sizes to one collective (Open MPI's
# non-blocking collectives, used under the watchdog, report it as error 15, MPI_ERR_TRUNCATE)
_SIZE_MISMATCH = re.compile(
    r"MPI_ERR_TRUNCATE|message truncated|MPI_ERR_COUNT|MPI Error in NBC subrequest \S+ : 15\b"
)
_MPI_ERROR_TYPE = "mpi4py.MPI.Exception"
# "allreduce: rank 0 passed float32(4), ranks 1-2 passed float32(5)" (runtime/debug.py)
_MISMATCH_GROUP = re.compile(
    r"(?:(?<=: )|(?<=, ))(?:rank (?P<one>\d+)|ranks (?P<many>\d+(?:[-,]\d+)*)) (?:passed|entered) "
)


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 1``, ``ranks 0,2``."""
    return f"rank {format_ranks(ranks)}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _once(facts: JobFacts) -> str:
    return f" (`{facts.rerun_one_rank}`)" if facts.rerun_one_rank else ""


def mismatch_culprits(message: str) -> list[int] | None:
    """The ranks that differ from the most common signature of a ``CollectiveMismatch``
    (on a tie the group holding the lowest rank, rank 0 when it is there, is taken as right);
    None when the message names no groups."""
    groups = [
        [int(m.group("one"))] if m.group("one") else parse_rank_list(m.group("many"))
        for m in _MISMATCH_GROUP.finditer(message.splitlines()[0] if message else "")
    ]
    if len(groups) < 2:
        return None
    right = min(groups, key=lambda g: (-len(g), min(g)))
    return sorted(r for g in groups if g is not right for r in g)


def _signal_note(e: RankExit) -> str:
    name = f" ({e.detail})" if e.detail else ""
    note = f"{who_ended(e)} was killed by signal {e.code}{name}"
    if e.code == 9:
        note += ": often the host ran out of memory (check dmesg), or a scheduler limit"
    elif e.code == 6:
        note += (
            ": an abort inside a library; with Open MPI's fork() warning, a subprocess, "
            "DumpGraph or a fork-started MultiprocessIterator is the usual cause"
        )
    elif e.code == 11:
        note += ": a crash in native code (CUDA, NCCL, MPI or a C extension)"
    return note


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


LAUNCHER_HUNG_NOTE = (
    "mpiexec went on running after every rank had ended and mnify run ended it: a known hang "
    "of Open MPI 5.0's PMIx server when a rank dies while another is in MPI_Finalize "
    "(`mnify doctor` names the affected versions)."
)


def _failed(facts: JobFacts) -> bool:
    if facts.launcher_outlived_ranks and facts.interrupted_by is None:
        # mpiexec's status is our SIGKILL: judge by the ranks (every one reached its end, 0)
        return bool(
            set(facts.exit_statuses) < set(range(facts.nprocs))
            or any(facts.exit_statuses.values())
            or any(tb.fatal for tb in facts.tracebacks)
            or any(e.status != 0 for e in facts.exit_reports)
            or facts.vanished
        )
    return bool(
        facts.exit_status != 0
        or facts.interrupted_by is not None
        or facts.stranded is not None
        or facts.stopped_after_failure
        or any(tb.fatal for tb in facts.tracebacks)
        or any(e.status != 0 for e in facts.exit_reports)
        or lost_daemon(facts.launcher_text)
    )


def _exit_status(facts: JobFacts) -> int:
    """What ``mnify run`` exits with: 128+N when told to stop by signal N; the leaving rank's
    status when the launcher ended a stranded job; else mpiexec's, never 0 for a failure."""
    if facts.interrupted_by is not None:
        return 128 + facts.interrupted_by
    if facts.stranded is not None:
        return next((s for s in facts.stranded.exited.values() if s != 0), 1)
    if facts.launcher_outlived_ranks:
        reported = [e.status for e in facts.exit_reports if e.status != 0]
        statuses = [s for s in facts.exit_statuses.values() if s != 0]
        return next(iter(reported + statuses), 1)
    return facts.exit_status or 1


def diagnose(facts: JobFacts) -> Diagnosis:
    """Classify the job; see the module docstring for the categories and their precedence."""
    exits = parse_launcher_messages(facts.launcher_text)
    stopped = _stopped(facts, exits)
    if stopped is not None:
        return stopped
    if not _failed(facts):
        return Diagnosis(Category.OK, 0, facts.nprocs, [], "the job succeeded", "", exits=exits)
    status = _exit_status(facts)
    groups = group_tracebacks(facts.tracebacks)
    errors = [g for g in groups if g.timed_out is None]
    timeouts = [g for g in groups if g.timed_out is not None]
    diagnosis = (
        _interrupted(facts, status)
        or _launch(facts, status)
        or _killed(facts, status, exits)
        or _error(facts, status, errors)
        or _launcher_killed(facts, status)
        or _vanished(facts, status)
        or _rank_exited(facts, status, exits, groups)
        or _communication(facts, status, timeouts)
        or _unexplained(facts, status)
    )
    if facts.launcher_outlived_ranks:
        diagnosis.hint += " " + LAUNCHER_HUNG_NOTE
    if diagnosis.category is not Category.COMMUNICATION:
        diagnosis.consequences = timeouts
        if not diagnosis.errors:
            diagnosis.errors = errors
        if timeouts and diagnosis.category is not Category.INTERRUPTED:
            waiting = sorted({r for g in timeouts for r in g.ranks})
            diagnosis.hint += (
                f" {_ranks(waiting).capitalize()} then timed out in a collective waiting for "
                "them: a consequence, not the cause."
            )
    diagnosis.exits = exits
    diagnosis.stranded = facts.stranded or facts.left_early
    if fork_warning(facts.launcher_text):
        diagnosis.hint += " " + FORK_NOTE
    return diagnosis


def _stopped(facts: JobFacts, exits: list[RankExit]) -> Diagnosis | None:
    """Every rank reported a stop after the same update and none failed: a requested end."""
    ranks = {s.rank for s in facts.stops}
    if not facts.stops or ranks != set(range(facts.nprocs)):
        return None
    if (
        facts.interrupted_by is not None
        or facts.stranded is not None
        or facts.stopped_after_failure
        or any(tb.fatal for tb in facts.tracebacks)
        or facts.exit_status > 128
    ):
        return None
    updates = sorted({s.updates for s in facts.stops})
    reasons = sorted({s.reason for s in facts.stops})
    status = max(s.status for s in facts.stops)
    headline = (
        f"every rank stopped after update {','.join(map(str, updates))} ({', '.join(reasons)})"
    )
    return Diagnosis(Category.STOPPED, status, facts.nprocs, [], headline, "", exits=exits)


def _interrupted(facts: JobFacts, status: int) -> Diagnosis | None:
    if facts.interrupted_by is None:
        return None
    name = _signal_name(facts.interrupted_by)
    how = "Ctrl-C" if facts.interrupted_by == signal.SIGINT else name
    return Diagnosis(
        Category.INTERRUPTED,
        status,
        facts.nprocs,
        [],
        f"stopped by {how}",
        f"mnify run received {name} and stopped every rank of the job (mpiexec and the ranks "
        "included). Errors the ranks printed before that are shown above.",
    )


def _launch(facts: JobFacts, status: int) -> Diagnosis | None:
    problem = find_launch_problem(facts.launcher_text)
    if problem is None or facts.ranks_heard >= set(range(facts.nprocs)):
        return None  # every rank ran: PRTE says "a daemon failed" of a host lost mid-job too
    return Diagnosis(
        Category.LAUNCH, status, facts.nprocs, [], problem.what, f"{problem.what}: {problem.hint}"
    )


def _killed(facts: JobFacts, status: int, exits: list[RankExit]) -> Diagnosis | None:
    if facts.stranded is not None or facts.stopped_after_failure:
        return None  # the launcher's own stop signals the ranks: not a cause
    killed = [e for e in exits if e.how == "signal"]
    if not killed:
        return None
    culprits = sorted({e.rank for e in killed if e.rank is not None})
    notes = "; ".join(_signal_note(e) for e in killed)
    return Diagnosis(
        Category.KILLED,
        status,
        facts.nprocs,
        culprits,
        "; ".join(
            f"{who_ended(e)} was killed by signal {e.code}" + (f" ({e.detail})" if e.detail else "")
            for e in killed
        ),
        f"{notes}. Other ranks' errors after it are consequences. Retry on one rank"
        f"{_once(facts)}: if it disappears there, it is in what running several ranks at once "
        "costs (memory, GPU sharing, fork() under MPI).",
    )


def _error(facts: JobFacts, status: int, errors: list[ErrorGroup]) -> Diagnosis | None:
    if not errors:
        return None
    mismatches = [g for g in errors if g.error_type.endswith("CollectiveMismatch")]
    if mismatches:
        return _mismatch(facts, status, mismatches)
    mpi_errors = all(g.error_type == _MPI_ERROR_TYPE for g in errors)
    if mpi_errors and (
        any(_SIZE_MISMATCH.search(g.message) for g in errors)
        or _SIZE_MISMATCH.search(facts.launcher_text)
    ):
        return Diagnosis(
            Category.RANK_DEPENDENT,
            status,
            facts.nprocs,
            [],
            "ranks passed buffers of different sizes to one collective",
            "MPI refused a collective whose ranks passed buffers of different sizes "
            "(MPI_ERR_TRUNCATE): the shapes depend on the rank, and MPI cannot say which rank "
            "differs." + ("" if facts.debug else " " + _DEBUG_ADVICE),
        )
    diagnosis = _user_error(facts, status, errors)
    if mpi_errors and not facts.debug:
        diagnosis.hint += " " + _DEBUG_ADVICE  # an MPI error inside a collective
    return diagnosis


def _mismatch(facts: JobFacts, status: int, mismatches: list[ErrorGroup]) -> Diagnosis:
    """``MNIFY_DEBUG``'s CollectiveMismatch: the culprits differ from the most common call."""
    culprits = mismatch_culprits(mismatches[0].message)
    if culprits is None:
        culprits = sorted({r for g in mismatches for r in g.ranks})
    return Diagnosis(
        Category.RANK_DEPENDENT,
        status,
        facts.nprocs,
        culprits,
        f"{_ranks(culprits)} passed different arguments to a collective",
        "MNIFY_DEBUG found ranks calling a collective differently: what they pass depends "
        f"on the rank; {_ranks(culprits)} differed from the most common call (rank 0's on a "
        "tie). Look at what differs there: the data shard (uneven sizes from scatter_dataset, "
        "a last batch of another size), code under `if comm.rank == 0:`, a collective only "
        "some ranks reach.",
        errors=mismatches,
    )


def _user_error(facts: JobFacts, status: int, errors: list[ErrorGroup]) -> Diagnosis:
    """Errors in the script: the same on every rank, or depending on the rank."""
    n = facts.nprocs
    failing = sorted({r for g in errors for r in g.ranks})
    if len(errors) == 1 and set(failing) >= set(range(n)):
        return Diagnosis(
            Category.SAME_ERROR,
            status,
            n,
            failing,
            f"{errors[0].error_type or 'one error'} on all {n} ranks",
            f"the same error on all {n} ranks: it does not depend on the rank or the GPU id. "
            f"Reproduce and debug it on one rank{_once(facts)}; it is in the script, its data "
            "or its environment, not in the communication.",
        )
    if set(failing) >= set(range(n)):
        return Diagnosis(
            Category.RANK_DEPENDENT,
            status,
            n,
            failing,
            f"{len(errors)} different errors on {_ranks(failing)}",
            f"every rank failed, but not in the same way ({len(errors)} different errors): "
            "the errors depend on the rank. Compare what differs between ranks: the data "
            "shard each one gets, the device id (use comm.intra_rank, not comm.rank, for the "
            "GPU), files or paths built from the rank.",
        )
    return Diagnosis(
        Category.RANK_DEPENDENT,
        status,
        n,
        failing,
        f"{_ranks(failing)} of {n} failed",
        f"only {_ranks(failing)} of {n} reported an error: it depends on the rank (unless the "
        "others were stopped by the abort before they reached it). Look at what differs on "
        "that rank: its data shard (scatter_dataset), its device id (comm.intra_rank, set "
        "once), code under `if comm.rank == 0:`, files or paths built from the rank.",
    )


_EARLY_EXIT_ADVICE = (
    "Every rank must reach the same collectives: look for a sys.exit, return or break that "
    "only some ranks take (early stopping decided per rank, a rank-0-only branch that ends the "
    "script, a data shard that runs out first), and take such decisions on every rank together "
    "(comm.bcast_obj or comm.allreduce_obj of the flag)."
)


def _rank_exited(
    facts: JobFacts, status: int, exits: list[RankExit], groups: list[ErrorGroup]
) -> Diagnosis | None:
    n = facts.nprocs
    s = facts.stranded or facts.left_early
    if s is not None:
        left = sorted(s.exited)
        said = ", ".join(f"rank {r} exited with status {s.exited[r]}" for r in left)
        ended = (
            f"mnify run ended the job after {s.seconds:.0f} s (--exit-timeout)"
            if facts.stranded is not None
            else "the job ended before --exit-timeout did"
        )
        return Diagnosis(
            Category.RANK_EXITED,
            status,
            n,
            left,
            f"{said} while {_ranks(s.waiting)} waited in {s.kind} #{s.seq}",
            f"{said} while {_ranks(s.waiting)} still waited for it in {s.kind} #{s.seq}; "
            f"{ended}. {_EARLY_EXIT_ADVICE}",
        )
    failed = {r for g in groups for r in g.ranks}  # their abort follows their traceback
    reported = {e.rank: e for e in facts.exit_reports if e.status != 0}
    by_mpiexec = {
        e.rank: e
        for e in exits
        if e.rank is not None and e.rank not in failed and e.how in ("exit", "abort")
    }
    left = sorted(set(reported) | set(by_mpiexec))
    if not left:
        return None
    parts = []
    for r in left:
        if r in reported:
            why = f": {reported[r].message}" if reported[r].message else ""
            parts.append(f"rank {r} exited with status {reported[r].status}{why}")
        elif by_mpiexec[r].how == "abort":
            parts.append(f"rank {r} called MPI_Abort (code {by_mpiexec[r].code})")
        else:
            parts.append(f"rank {r} exited with status {by_mpiexec[r].code}")
    said = "; ".join(parts)
    return Diagnosis(
        Category.RANK_EXITED,
        status,
        n,
        left,
        said,
        f"{said}, without a Python traceback, and the job ended with it. If that exit is "
        f"meant (a failed check, a usage error), it says why above. {_EARLY_EXIT_ADVICE}",
    )


def _launcher_killed(facts: JobFacts, status: int) -> Diagnosis | None:
    """mpiexec died of a signal nobody in the job sent: the ranks went with it."""
    if facts.launcher_signal is None:
        return None
    name = _signal_name(facts.launcher_signal)
    return Diagnosis(
        Category.KILLED,
        status,
        facts.nprocs,
        [],
        f"the launcher was killed by signal {facts.launcher_signal} ({name})",
        f"mpiexec itself was killed by {name} (from outside the job: a user, a batch "
        "scheduler's limit, the out-of-memory killer; or a crash of mpiexec) and took the ranks "
        "with it. No rank is to blame; mnify run removed what the launcher left behind.",
    )


def _vanished(facts: JobFacts, status: int) -> Diagnosis | None:
    """Ranks that died before anything else happened, without a report or a launcher message."""
    if not facts.vanished:
        return None
    who = _ranks(facts.vanished)
    return Diagnosis(
        Category.KILLED,
        status,
        facts.nprocs,
        list(facts.vanished),
        f"{who} died without a report (a signal or a crash)",
        f"{who} ended before its script did, printed nothing and was not reported by mpiexec: "
        "killed by a signal (SIGKILL from the out-of-memory killer or a user) or a crash in "
        "native code. Check dmesg; retry on one rank"
        f"{_once(facts)}.",
    )


def _communication(facts: JobFacts, status: int, timeouts: list[ErrorGroup]) -> Diagnosis | None:
    lost = lost_daemon(facts.launcher_text)
    if not timeouts and not lost:
        return None
    missing = sorted({r for g in timeouts if g.timed_out for r in g.timed_out.missing})
    if timeouts and timeouts[0].timed_out is not None:
        t = timeouts[0].timed_out
        waiting = sorted({r for g in timeouts for r in g.ranks})
        who = _ranks(missing) if missing else "some rank"
        headline = (
            f"{who} never arrived at {t.kind} #{t.seq} ({_ranks(waiting)} waited {t.seconds:g} s)"
        )
        what = (
            f"collective {t.kind} #{t.seq} timed out waiting for "
            f"rank(s) {format_ranks(missing) if missing else 'it could not name'}"
        )
    else:
        headline = "mpiexec lost a remote daemon (a host dropped off the network)"
        what = headline
    return Diagnosis(
        Category.COMMUNICATION,
        status,
        facts.nprocs,
        missing,
        headline,
        f"a communication failure: {what}. Retry on one rank{_once(facts)}: if the error "
        "disappears there, it is in the communication: ranks calling collectives in a "
        "different order or a different number of times (rank-0-only code, uneven data), a "
        "rank stuck in I/O or a hang, or the network between hosts. MNIFY_DEBUG=1 makes the "
        "ranks compare every collective before running it.",
        errors=timeouts,
    )


def _unexplained(facts: JobFacts, status: int) -> Diagnosis:
    if not facts.ranks_heard and not facts.tracebacks:
        return Diagnosis(
            Category.LAUNCH,
            status,
            facts.nprocs,
            [],
            f"mpiexec exited with status {status} before any rank started",
            "no rank printed anything or started its script: look at mpiexec's message above. "
            "Check the host names, ssh to each host, and the hostfile (`mnify doctor "
            "--hostfile FILE`).",
        )
    return Diagnosis(
        Category.RANK_EXITED,
        status,
        facts.nprocs,
        [],
        f"mpiexec exited with status {status} without naming a rank",
        "no Python traceback was printed and mpiexec did not say which rank ended the job. "
        f"Look at the output above; retry on one rank{_once(facts)} to see whether it depends "
        "on running several ranks.",
    )
