"""Cutting the ranks' reports (tracebacks, exit statuses) out of their stderr while the job runs.

Besides tracebacks it takes out the one-line JSON reports rank 0 prints for the launcher:
``--verify``'s verdict and the write net's files that several ranks wrote (docs/write_net.md).

:class:`TracebackCollector` recognises plain Python tracebacks, the runtime's
``[mnify] rank R (host H) failed:`` reports, the bootstrap's ``[mnify] rank R (host H) exited
with status N`` lines and Chainer's echo of an error in its training loop (``Exception in main
training loop: ...``, a partial traceback printed before the real one), holds them back from the
live output so the end of the job can show each distinct one once, and hands back a block that
stops growing while the job goes on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

TRACEBACK_START = "Traceback (most recent call last):"
_MNIFY_HEADER = re.compile(r"^\[mnify\] rank (?P<rank>\d+) \(host (?P<host>[^)]*)\) failed:\s*$")
_EXIT_REPORT = re.compile(
    r"^\[mnify\] rank (?P<rank>\d+) \(host (?P<host>[^)]*)\) exited with status "
    r"(?P<status>-?\d+)(?:: (?P<message>.*))?$"
)
# mnify.runtime.update_watch.stop_report_line: a rank ended cleanly after a requested update
_STOP_REPORT = re.compile(
    r"^\[mnify\] rank (?P<rank>\d+) \(host (?P<host>[^)]*)\) stopped after update "
    r"(?P<updates>\d+) \(status (?P<status>-?\d+)\): (?P<reason>.*)$"
)
# mnify.runtime.verify: rank 0's findings as one JSON line
VERIFY_REPORT_PREFIX = "[mnify] verify report: "
# mnify.runtime.write_net: rank 0's files that several ranks wrote, as one JSON line
WRITE_NET_PREFIX = "[mnify] shared writes: "
# Chainer's Trainer.run prints this, a traceback without the exception line, and LOOP_ECHO_END,
# then finalizes its extensions and re-raises: the same error is printed again in full.
LOOP_ECHO_START = "Exception in main training loop: "
LOOP_ECHO_END = "Will finalize trainer extensions and updater before reraising the exception."
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
_RUNTIME_FRAME = re.compile(
    r'^  File ".*[/\\]mnify[/\\]runtime[/\\][^"]*", line \d+, in (?P<func>\S+)'
)
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::(?: (?P<message>.*))?)?$")


def exit_report_line(rank: int, host: str, status: int, message: str = "") -> str:
    """The line the bootstrap prints when a rank's script ends with a non-zero status."""
    tail = f": {message}" if message else ""
    return f"[mnify] rank {rank} (host {host}) exited with status {status}{tail}"


@dataclass(frozen=True)
class RankExitReport:
    """A rank's own word that its script ended with a non-zero status."""

    rank: int
    host: str
    status: int
    message: str = ""


@dataclass(frozen=True)
class RankStopReport:
    """A rank's word that it stopped on purpose after ``updates`` updates (``--verify``,
    ``mnify scale``): the end of the script, not a failure."""

    rank: int
    host: str
    updates: int
    status: int
    reason: str


@dataclass
class RankTraceback:
    """A traceback one rank printed (lines without the rank tag or the ``[mnify]`` header)."""

    rank: int
    lines: list[str]
    host: str | None = None
    shown: bool = False  # already printed raw while the job ran
    fatal: bool = False  # announced by the ``[mnify] rank R failed:`` header: the rank died of it
    seen_at: float = 0.0  # when its first line arrived (the collector's clock)
    loop_echo: bool = False  # Chainer's partial echo, printed before the full traceback

    @property
    def text(self) -> str:
        return "\n".join(fold_runtime_frames(strip_launcher_frames(self.lines))).rstrip()

    @property
    def error_type(self) -> str:
        """``ValueError``, ``mnify.runtime.errors.CollectiveTimeout``; "" when not printed."""
        return self._exception()[0]

    @property
    def error_message(self) -> str:
        """The exception's message, continuation lines and notes included."""
        return self._exception()[1]

    def _exception(self) -> tuple[str, str]:
        lines = strip_launcher_frames(self.lines)
        if self.loop_echo:
            first = lines[0] if lines else ""
            return "", first[len(LOOP_ECHO_START) :] if first.startswith(LOOP_ECHO_START) else ""
        start = 0
        for i, line in enumerate(lines):
            if line.startswith('  File "') or line == TRACEBACK_START:
                start = i + 1
        while start < len(lines) and lines[start].startswith("    "):
            start += 1  # the last frame's source line and carets
        tail = [line for line in lines[start:] if line not in _CHAIN_LINES]
        while tail and not tail[0].strip():
            tail.pop(0)
        if not tail:
            return "", ""
        match = _EXCEPTION_LINE.match(tail[0])
        if match is None:
            return "", "\n".join(tail).strip()
        rest = [match.group("message") or "", *tail[1:]]
        return match.group("type"), "\n".join(rest).strip()

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


def fold_runtime_frames(lines: Sequence[str]) -> list[str]:
    """Consecutive frames inside ``mnify.runtime`` become one line naming the first and last
    function: where the user's code entered the runtime and where it failed."""
    out: list[str] = []
    run: list[str] = []  # function names of the frames being folded

    def flush() -> None:
        if run:
            where = run[0] if len(run) == 1 else f"{run[0]} … {run[-1]}"
            count = f"{len(run)} frames" if len(run) > 1 else "1 frame"
            out.append(f"  [{count} inside mnify.runtime: {where}]")
            run.clear()

    folding = False
    for line in lines:
        match = _RUNTIME_FRAME.match(line)
        if match:
            run.append(match.group("func"))
            folding = True
            continue
        if folding and line.startswith("    "):
            continue  # source line or carets of a folded frame
        folding = False
        flush()
        out.append(line)
    flush()
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
        self.exits: list[RankExitReport] = []
        self.stops: list[RankStopReport] = []
        self.verify_reports: list[str] = []  # the JSON text after VERIFY_REPORT_PREFIX
        self.write_net_reports: list[str] = []  # the JSON text after WRITE_NET_PREFIX

    def feed(self, rank: int, text: str, now: float = 0.0) -> list[str]:
        st = self._ranks.setdefault(rank, _RankState())
        st.last_line_at = now
        ended = _EXIT_REPORT.match(text)
        if ended:
            self._close(st)
            self.exits.append(
                RankExitReport(
                    int(ended.group("rank")),
                    ended.group("host"),
                    int(ended.group("status")),
                    ended.group("message") or "",
                )
            )
            return []
        stopped = _STOP_REPORT.match(text)
        if stopped:
            self._close(st)
            self.stops.append(
                RankStopReport(
                    int(stopped.group("rank")),
                    stopped.group("host"),
                    int(stopped.group("updates")),
                    int(stopped.group("status")),
                    stopped.group("reason"),
                )
            )
            return []
        if text.startswith(VERIFY_REPORT_PREFIX):
            self.verify_reports.append(text[len(VERIFY_REPORT_PREFIX) :])
            return []
        if text.startswith(WRITE_NET_PREFIX):
            self.write_net_reports.append(text[len(WRITE_NET_PREFIX) :])
            return []
        header = _MNIFY_HEADER.match(text.lstrip())  # MPI_Abort may print first on the line
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
        if text.startswith(LOOP_ECHO_START) and st.state in (_State.OUTSIDE, _State.MESSAGE):
            self._close(st)
            st.block = self._open(rank, st.host, now)
            st.block.loop_echo = True
            st.block.lines.append(text)
            st.state = _State.CHAIN  # its traceback follows
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
