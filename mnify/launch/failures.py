"""Reading a failed job: collapse the ranks' tracebacks and say what kind of failure it is.

The advice of people who debugged ChainerMN jobs (seed 003), applied for the user:

- the same error as many times as there are ranks does not depend on the rank or GPU id: debug it
  on one rank;
- an error on some ranks only depends on the rank (its data shard, its device id, rank-0-only code);
- a communication failure (a watchdog :class:`~mnify.runtime.errors.CollectiveTimeout`, an MPI
  abort without a Python error, a rank killed by a signal): retry on one rank; if the error
  disappears there, it is in the communication.

Tracebacks are cut out of each rank's stderr by :class:`TracebackCollector` while the job runs
(plain Python ones and the runtime's ``[mnify] rank R (host H) failed:`` reports), then
:func:`summarize` groups identical ones and :func:`render_summary` prints one per group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from mnify.runtime.errors import format_ranks

TRACEBACK_START = "Traceback (most recent call last):"
_MNIFY_HEADER = re.compile(r"^\[mnify\] rank (?P<rank>\d+) \(host (?P<host>[^)]*)\) failed:\s*$")
_CHAIN_LINES = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# Lines that end a traceback block: Open MPI's banners around its abort and fork messages,
# MPICH's one-line abort report.
_BLOCK_BREAK = re.compile(r"^-{20,}\s*$|^MPI_ABORT was invoked|^Abort\(\d+\) on node \d+")
COLLECTIVE_TIMEOUT = re.compile(
    r"collective (?P<kind>\S+) #(?P<seq>\d+) timed out after (?P<timeout>[\d.eE+-]+) s "
    r"on rank (?P<rank>\d+): rank\(s\) (?P<missing>\S+) never arrived"
)
# Frames of a launcher (python -m mpi4py SCRIPT, mnify's bootstrap), dropped from tracebacks.
_LAUNCHER_FILES = re.compile(
    r'^  File "(?:<frozen runpy>|.*[/\\]runpy\.py|.*[/\\]mpi4py[/\\](?:run|__main__)\.py'
    r'|.*[/\\]mnify[/\\]launch[/\\]bootstrap\.py)"'
)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


@dataclass
class RankTraceback:
    """A traceback one rank printed (lines without the rank tag or the ``[mnify]`` header)."""

    rank: int
    lines: list[str]
    host: str | None = None
    shown: bool = False  # already printed raw while the job ran
    fatal: bool = False  # announced by the ``[mnify] rank R failed:`` header: the rank died of it
    seen_at: float = 0.0  # when its first line arrived (the collector's clock)

    @property
    def text(self) -> str:
        return "\n".join(strip_launcher_frames(self.lines)).rstrip()

    @property
    def exception_line(self) -> str:
        """The last ``Type: message`` line (the one people search for)."""
        for line in reversed(strip_launcher_frames(self.lines)):
            if line and not line.startswith(" ") and line not in _CHAIN_LINES:
                return line
        return ""

    @property
    def timeout(self) -> re.Match[str] | None:
        return COLLECTIVE_TIMEOUT.search(self.text)


def strip_launcher_frames(lines: Sequence[str]) -> list[str]:
    """Drop the frames of ``runpy`` and mpi4py's runner that ``python -m mpi4py`` adds."""
    out: list[str] = []
    dropping = False
    for line in lines:
        if line.startswith('  File "'):
            dropping = bool(_LAUNCHER_FILES.match(line))
            if dropping:
                continue
        elif dropping and line.startswith("    "):
            continue  # source line or carets of a dropped frame
        else:
            dropping = False
        out.append(line)
    return out


class _State(Enum):
    OUTSIDE = 0
    FRAMES = 1  # after "Traceback ...": frames until the exception line
    MESSAGE = 2  # after the exception line: message continuation, notes, chained tracebacks
    BLANK = 3  # a blank line after the message: either a chain follows or the block is over
    CHAIN = 4  # after "During handling ..." / "The above exception ...": the next traceback


@dataclass
class _RankState:
    state: _State = _State.OUTSIDE
    block: RankTraceback | None = None
    last_line_at: float = 0.0
    host: str | None = None
    fatal: bool = False  # opened by the ``[mnify] ... failed:`` header: the rank is dying


class TracebackCollector:
    """Cuts tracebacks out of per-rank stderr as lines arrive.

    After the ``[mnify] rank R (host H) failed:`` header every line up to an Open MPI banner
    belongs to the report (the rank is about to abort). A bare ``Traceback`` (a handled error, or
    a script run without the runtime) ends at its exception line plus continuation lines up to a
    blank line, unless a chained traceback follows.

    :meth:`feed` returns the lines to show now; traceback lines are held back so the end of the
    job can show each distinct traceback once. A block that stops growing while the job goes on
    (a handled exception, a rank that hangs after printing) is handed back by :meth:`stale`.
    """

    def __init__(self) -> None:
        self._ranks: dict[int, _RankState] = {}
        self.tracebacks: list[RankTraceback] = []

    def feed(self, rank: int, text: str, now: float = 0.0) -> list[str]:
        st = self._ranks.setdefault(rank, _RankState())
        st.last_line_at = now
        header = _MNIFY_HEADER.match(text)
        if header:
            self._close(st)
            st.host = header.group("host")
            st.block = self._open(rank, st.host, now)
            st.block.fatal = True
            st.state = _State.FRAMES
            st.fatal = True
            return []
        if st.fatal and st.block is not None:
            # Everything a dying rank prints after its header is its report, blank lines and
            # multi-line messages (Chainer's InvalidType: Expect/Actual) included.
            if _BLOCK_BREAK.match(text):
                self._close(st)
                return [text]
            st.block.lines.append(text)
            return []
        if text.startswith(TRACEBACK_START) and st.state in (_State.OUTSIDE, _State.MESSAGE):
            self._close(st)  # a new traceback right after a message is a separate one
            st.block = self._open(rank, st.host, now)
            st.block.lines.append(text)
            st.state = _State.FRAMES
            return []
        if st.state is _State.OUTSIDE or st.block is None:
            return [text]
        block = st.block
        if st.state is _State.FRAMES:
            if text.startswith(TRACEBACK_START):
                block.lines.append(text)
            elif _BLOCK_BREAK.match(text):
                self._close(st)
                return [text]
            else:
                block.lines.append(text)
                if text and not text.startswith((" ", "\t")):
                    st.state = _State.MESSAGE
            return []
        if st.state is _State.CHAIN:
            block.lines.append(text)
            if text.startswith(TRACEBACK_START):
                st.state = _State.FRAMES
            return []
        if st.state is _State.BLANK:
            if text in _CHAIN_LINES:
                block.lines += ["", text]
                st.state = _State.CHAIN
                return []
            if not text:
                return []
            self._close(st)
            return ["", *self.feed(rank, text, now)]
        # MESSAGE: continuation lines until a blank line or a banner
        if not text:
            st.state = _State.BLANK
            return []
        if _BLOCK_BREAK.match(text):
            self._close(st)
            return [text]
        block.lines.append(text)
        return []

    def stale(self, now: float, hold_seconds: float) -> list[RankTraceback]:
        """Blocks that got no line for ``hold_seconds``: closed and returned to be shown raw."""
        out = []
        for st in self._ranks.values():
            # A dying rank's report is never stale: the summary at the end shows it.
            if st.block is not None and not st.fatal and now - st.last_line_at >= hold_seconds:
                block = st.block
                self._close(st)
                block.shown = True
                out.append(block)
        return out

    def first_fatal(self) -> RankTraceback | None:
        """The first report of a rank that announced its death, if any."""
        return next((tb for tb in self.tracebacks if tb.fatal), None)

    def finish(self) -> list[RankTraceback]:
        """Close every open block; all tracebacks seen, in order of appearance."""
        for st in self._ranks.values():
            self._close(st)
        return self.tracebacks

    def _open(self, rank: int, host: str | None, now: float = 0.0) -> RankTraceback:
        block = RankTraceback(rank=rank, lines=[], host=host, seen_at=now)
        self.tracebacks.append(block)
        return block

    def _close(self, st: _RankState) -> None:
        if st.block is not None:
            while st.block.lines and not st.block.lines[-1].strip():
                st.block.lines.pop()
            if not st.block.lines:
                self.tracebacks.remove(st.block)
        st.block = None
        st.state = _State.OUTSIDE
        st.fatal = False


@dataclass(frozen=True)
class RankExit:
    """What mpiexec said about a rank that ended the job."""

    rank: int | None  # None: mpiexec did not say which (MPICH 4+ names the PID only)
    how: str  # "abort", "signal" or "exit"
    code: int  # abort error code, signal number or exit status
    detail: str = ""  # "Killed", "Aborted", ...


_OMPI_SIGNAL = re.compile(
    r"noticed that process rank (?P<rank>\d+) with PID \d+ on node \S+ exited on\s+signal "
    r"(?P<sig>\d+)(?: \((?P<name>[^)]*)\))?"
)
_OMPI_ABORT_BY = re.compile(
    r"due to process rank (?P<rank>\d+) with PID \d+ on node \S+ calling\s+\"abort\""
)
_MPI_ABORT = re.compile(
    r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator \S+(?:.*?Errorcode: (?P<code>\d+))?",
    re.S,
)
_OMPI_EXIT = re.compile(
    r"exited with non-zero status.*?Process name: \[(?:\[\d+,\d+\],|[^@\]]*@\d+,)(?P<rank>\d+)\]\s+"
    r"Exit code:\s+(?P<code>\d+)",
    re.S,
)
_MPICH_ABORT = re.compile(r"Abort\((?P<code>\d+)\) on node \d+ \(rank (?P<rank>\d+) in comm 0\)")
_MPICH_EXIT_STRING = re.compile(r"EXIT STRING: (?P<name>[^(]+?) \(signal (?P<sig>\d+)\)")
_MPICH_BAD = re.compile(
    r"RANK (?P<rank>\d+) PID \d+ RUNNING AT \S+\s*=\s*(?:KILLED BY SIGNAL: (?P<sig>\d+)"
    r"(?: \((?P<name>[^)]*)\))?|EXIT STATUS: (?P<code>\d+))"
)


def parse_launcher_messages(text: str) -> list[RankExit]:
    """Rank endings reported in mpiexec's own output (and in ranks' MPI_ABORT banners)."""
    flat = re.sub(r"\s+", " ", text)
    found: dict[tuple[int | None, str], RankExit] = {}
    for m in _OMPI_SIGNAL.finditer(flat):
        rank, sig = int(m.group("rank")), int(m.group("sig"))
        found[(rank, "signal")] = RankExit(rank, "signal", sig, m.group("name") or "")
    for m in _MPI_ABORT.finditer(text):
        rank = int(m.group("rank"))
        found[(rank, "abort")] = RankExit(rank, "abort", int(m.group("code") or 1))
    for m in _OMPI_ABORT_BY.finditer(flat):
        rank = int(m.group("rank"))
        found.setdefault((rank, "abort"), RankExit(rank, "abort", 1))
    for m in _OMPI_EXIT.finditer(text):
        rank = int(m.group("rank"))
        found[(rank, "exit")] = RankExit(rank, "exit", int(m.group("code")))
    for m in _MPICH_BAD.finditer(flat):
        rank = int(m.group("rank"))
        if m.group("sig"):
            found[(rank, "signal")] = RankExit(
                rank, "signal", int(m.group("sig")), m.group("name") or ""
            )
        elif m.group("code") and int(m.group("code")) != 0:
            found[(rank, "exit")] = RankExit(rank, "exit", int(m.group("code")))
    for m in _MPICH_ABORT.finditer(flat):
        rank = int(m.group("rank"))
        found[(rank, "abort")] = RankExit(rank, "abort", int(m.group("code")))
    if not any(how == "signal" for _, how in found):
        for m in _MPICH_EXIT_STRING.finditer(flat):
            sig = int(m.group("sig"))
            found[(None, "signal")] = RankExit(None, "signal", sig, m.group("name").strip())
    return sorted(found.values(), key=lambda e: (-1 if e.rank is None else e.rank, e.how))


def _who(e: RankExit) -> str:
    return "a rank" if e.rank is None else f"rank {e.rank}"


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


def describe_exit(e: RankExit) -> str:
    """One rank ending as mpiexec reported it, in words."""
    if e.how == "abort":
        return f"{_who(e)} called MPI_Abort (code {e.code})"
    if e.how == "signal":
        name = f" ({e.detail})" if e.detail else ""
        return f"{_who(e)} was killed by signal {e.code}{name}"
    return f"{_who(e)} exited with status {e.code}"


def _signal_note(exits: Sequence[RankExit]) -> str:
    notes = []
    for e in exits:
        if e.how != "signal":
            continue
        name = f" ({e.detail})" if e.detail else ""
        note = f"{_who(e)} was killed by signal {e.code}{name}"
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
                f"{_who(ended[0])} exited with status {ended[0].code}"
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
