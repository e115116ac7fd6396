"""Running the mpiexec job: stream rank output as it comes, keep tracebacks for the summary.

Two reader threads turn mpiexec's stdout and stderr into lines on one queue; the calling thread
writes them out (without mpiexec's rank tags unless asked) and feeds each rank's stderr to a
:class:`~mnify.launch.rank_reports.TracebackCollector`, which holds tracebacks back so a failed job
can show each distinct one once. A held traceback that stops growing while the job still runs is
printed raw after ``hold_seconds`` so a rank that hangs after a handled error is not hidden.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, TextIO

from mnify.launch.banners import BannerFilter
from mnify.launch.command import LaunchCommand
from mnify.launch.mpiexec import Flavor
from mnify.launch.rank_reports import RankTraceback, TracebackCollector
from mnify.launch.ranklines import RankLine, parse_line

_EOF = object()


@dataclass
class JobResult:
    """How the job ended and what the summary needs from its output."""

    returncode: int
    tracebacks: list[RankTraceback]
    launcher_text: str  # stderr outside tracebacks: mpiexec's reports, MPI_ABORT banners
    stderr_by_rank: dict[int, list[str]] = field(default_factory=dict)
    interrupted: bool = False
    stopped_after_failure: bool = False  # mpiexec outlived a rank's abort and we ended it


def _read_lines(stream: IO[bytes], name: str, sink: queue.Queue[object]) -> None:
    for raw in iter(stream.readline, b""):
        sink.put((name, raw.decode("utf-8", errors="replace").rstrip("\r\n").replace("\x00", "")))
    sink.put(_EOF)


class _Printer:
    """Writes rank lines to the caller's streams, tagged ``[R] `` when asked."""

    def __init__(self, out: TextIO, err: TextIO, tag_output: bool) -> None:
        self.out, self.err, self.tag_output = out, err, tag_output

    def write(self, rank: int | None, text: str, stream: str) -> None:
        target = self.out if stream == "stdout" else self.err
        prefix = f"[{rank}] " if self.tag_output and rank is not None else ""
        target.write(f"{prefix}{text}\n")
        target.flush()


@dataclass
class _Pump:
    """Routes each line: rank stderr through the traceback collector, then Open MPI's boxes."""

    flavor: Flavor
    printer: _Printer
    collector: TracebackCollector = field(default_factory=TracebackCollector)
    banners: BannerFilter = field(default_factory=BannerFilter)
    launcher: list[str] = field(default_factory=list)
    stderr_by_rank: dict[int, list[str]] = field(default_factory=dict)

    def next(self, lines: queue.Queue[object]) -> int:
        """Handle the next line (or time out quietly); returns 1 when a stream ended, else 0."""
        try:
            item = lines.get(timeout=0.25)
        except queue.Empty:
            return 0
        if item is _EOF:
            return 1
        assert isinstance(item, tuple)
        stream: str = item[0]
        line: RankLine = parse_line(item[1], self.flavor, stream)
        if line.rank is None:
            self.launcher.append(line.text)
            self._show(None, line.text, stream)
        elif stream == "stderr":
            self.stderr_by_rank.setdefault(line.rank, []).append(line.text)
            for shown in self.collector.feed(line.rank, line.text, time.monotonic()):
                self.launcher.append(shown)
                self._show(line.rank, shown, "stderr")
        else:
            self.printer.write(line.rank, line.text, "stdout")
        return 0

    def _show(self, rank: int | None, text: str, stream: str) -> None:
        # Boxes come on stderr (Open MPI, ranks' MPI_ABORT) or on mpiexec's stdout (MPICH).
        if stream != "stderr" and rank is not None:
            self.printer.write(rank, text, stream)
            return
        for shown in self.banners.feed(rank, text):
            self.printer.write(rank, shown, stream)

    def release_stale(self, hold_seconds: float) -> None:
        for block in self.collector.stale(time.monotonic(), hold_seconds):
            for text in block.lines:
                self.printer.write(block.rank, text, "stderr")

    def finish(self) -> list[RankTraceback]:
        for rank, text in self.banners.flush():
            self.printer.write(rank, text, "stderr")
        return self.collector.finish()


def run_job(
    command: LaunchCommand,
    flavor: Flavor,
    *,
    out: TextIO,
    err: TextIO,
    tag_output: bool = False,
    hold_seconds: float = 10.0,
    abort_timeout: float = 30.0,
    base_env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> JobResult:
    """Run ``command`` to completion; returns mpiexec's exit status and the ranks' tracebacks.

    mpiexec runs in a session of its own so that everything it started (launch agents, daemons)
    can be stopped together. When a rank has announced its death and mpiexec has still not ended
    the job ``abort_timeout`` seconds later (an abort lost between hosts), the job is stopped
    here: a failed rank must never leave the job hanging.
    """
    proc = subprocess.Popen(
        command.argv,
        env=command.full_env(base_env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: queue.Queue[object] = queue.Queue()
    readers = [
        threading.Thread(target=_read_lines, args=(proc.stdout, "stdout", lines), daemon=True),
        threading.Thread(target=_read_lines, args=(proc.stderr, "stderr", lines), daemon=True),
    ]
    for reader in readers:
        reader.start()

    pump = _Pump(flavor, _Printer(out, err, tag_output))
    interrupted = False
    stopped_at: float | None = None
    open_streams = len(readers)
    while open_streams:
        try:
            open_streams -= pump.next(lines)
            pump.release_stale(hold_seconds)
            now = time.monotonic()
            if stopped_at is None:
                fatal = pump.collector.first_fatal()
                if fatal is not None and fatal.seen_at + abort_timeout <= now:
                    err.write(
                        f"mnify run: rank {fatal.rank} failed {abort_timeout:g} s ago and mpiexec "
                        "has not ended the job; stopping it\n"
                    )
                    err.flush()
                    _signal_job(proc, signal.SIGTERM)
                    stopped_at = now
            elif now - stopped_at > 5:
                _signal_job(proc, signal.SIGKILL)
                if proc.poll() is not None and now - stopped_at > 10:
                    break  # something outside the session still holds the pipes
        except KeyboardInterrupt:
            # mpiexec has its own session, so pass the interrupt on; it stops the ranks. Keep
            # reading until it has, so their last words (and the summary) still appear. A
            # second Ctrl-C kills the whole job.
            _signal_job(proc, signal.SIGKILL if interrupted else signal.SIGINT)
            interrupted = True
    try:
        returncode = proc.wait()
    except KeyboardInterrupt:
        _signal_job(proc, signal.SIGKILL)
        returncode = proc.wait()
        interrupted = True
    return JobResult(
        returncode=returncode,
        tracebacks=pump.finish(),
        launcher_text="\n".join(pump.launcher),
        stderr_by_rank=pump.stderr_by_rank,
        interrupted=interrupted,
        stopped_after_failure=stopped_at is not None,
    )


def _signal_job(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal mpiexec and everything in its session (it leads its own process group)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
