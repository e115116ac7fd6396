"""Running the mpiexec job: stream rank output as it comes, keep tracebacks for the summary.

Two reader threads turn mpiexec's stdout and stderr into lines on one queue; the calling thread
writes them out (without mpiexec's rank tags unless asked) and feeds each rank's stderr to a
:class:`~mnify.launch.rank_reports.TracebackCollector`, which holds tracebacks back so a failed job
can show each distinct one once. A held traceback that stops growing while the job still runs is
printed raw after ``hold_seconds`` so a rank that hangs after a handled error is not hidden.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, TextIO

from mnify.launch import parent_death, session
from mnify.launch.banners import BannerFilter
from mnify.launch.command import LaunchCommand
from mnify.launch.early_exit import EarlyExitWatch, StrandedRanks
from mnify.launch.janitor import Janitor
from mnify.launch.job_processes import LAUNCHER_GRACE, JobProcesses
from mnify.launch.mpiexec import Flavor
from mnify.launch.rank_reports import (
    RankExitReport,
    RankStopReport,
    RankTraceback,
    TracebackCollector,
)
from mnify.launch.ranklines import RankLine, parse_line
from mnify.runtime import mpi_files

_EOF = object()
# What prterun says when told to stop (interactive advice meant for a terminal).
_INTERACTIVE_ABORT = re.compile(r"abort is (?:already )?in progress\.\.\.hit ctrl-c again", re.I)


@dataclass
class JobResult:
    """How the job ended and what the summary needs from its output."""

    returncode: int
    tracebacks: list[RankTraceback]
    launcher_text: str  # stderr outside tracebacks: mpiexec's reports, MPI_ABORT banners
    stderr_by_rank: dict[int, list[str]] = field(default_factory=dict)
    interrupted_by: int | None = None  # SIGINT, SIGTERM or SIGHUP received by ``mnify run``
    stopped_after_failure: bool = False  # mpiexec outlived a rank's abort and we ended it
    stranded: StrandedRanks | None = None  # a rank left others waiting and we ended the job
    exit_reports: list[RankExitReport] = field(default_factory=list)
    ranks_heard: frozenset[int] = frozenset()  # ranks that printed or published their state
    stops: list[RankStopReport] = field(default_factory=list)  # ranks stopped after an update
    verify_reports: list[str] = field(default_factory=list)  # rank 0's --verify JSON lines
    write_net_reports: list[str] = field(default_factory=list)  # rank 0's write net JSON lines
    left_early: StrandedRanks | None = None  # a rank left while others waited (not ended by us)
    launcher_outlived_ranks: bool = False  # every rank had ended; mpiexec hung and we ended it
    launcher_signal: int | None = None  # mpiexec was killed by this signal, not by mnify run
    vanished: list[int] = field(default_factory=list)  # ranks that died without a word
    exit_statuses: dict[int, int] = field(default_factory=dict)  # ranks that reached their end
    reclaimed: list[str] = field(default_factory=list)  # Open MPI files of the job removed here


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
        try:
            target.write(f"{prefix}{text}\n")
            target.flush()
        except (OSError, ValueError):
            pass  # the terminal is gone (SIGHUP); keep reading so the job can be stopped


@dataclass
class _Pump:
    """Routes each line: rank stderr through the traceback collector, then Open MPI's boxes."""

    flavor: Flavor
    printer: _Printer
    collector: TracebackCollector = field(default_factory=TracebackCollector)
    banners: BannerFilter = field(default_factory=BannerFilter)
    launcher: list[str] = field(default_factory=list)
    stderr_by_rank: dict[int, list[str]] = field(default_factory=dict)
    ranks_heard: set[int] = field(default_factory=set)

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
            if _INTERACTIVE_ABORT.search(line.text):
                return 0  # prterun's "hit ctrl-c again": mnify run does the stopping
            self.launcher.append(line.text)
            self._show(None, line.text, stream)
            return 0
        self.ranks_heard.add(line.rank)
        if stream == "stderr":
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
    nprocs: int,
    out: TextIO,
    err: TextIO,
    tag_output: bool = False,
    hold_seconds: float = 10.0,
    abort_timeout: float = 30.0,
    exit_timeout: float = 60.0,
    base_env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> JobResult:
    """Run ``command`` to completion; returns mpiexec's exit status and the ranks' reports.

    mpiexec runs in a session of its own so that everything it started (ranks, launch agents,
    daemons) can be stopped together. The job is stopped here, never left running, when:

    - a rank has announced its death and mpiexec has not ended the job ``abort_timeout``
      seconds later (an abort lost between hosts);
    - a rank has been exiting while another waited for it in a collective for ``exit_timeout``
      seconds (0: never), see :mod:`mnify.launch.early_exit`;
    - ``mnify run`` itself gets SIGINT, SIGTERM or SIGHUP. The signal goes on to mpiexec
      (SIGINT) or to the whole session (the others); whatever is left 5 s later is killed.

    When mpiexec has exited, anything still in its session is killed too.
    """
    state_dir = tempfile.mkdtemp(prefix="mnify-run-")
    # what only this process reads: the ranks' state, rank 0's write net report as JSON (a
    # --dry-run command run by hand keeps the write net's plain lines)
    here = dataclasses.replace(
        command.wiring,
        rank_state_dir=state_dir,
        rank_state_host=socket.gethostname(),
        write_net_report=True,
    )
    command = command.with_wiring(here)
    env = command.full_env(base_env)
    try:
        with _stop_signals():
            return _run(
                command, env, flavor, nprocs, out, err, tag_output, hold_seconds,
                abort_timeout, exit_timeout, state_dir, cwd,
            )  # fmt: skip
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


class StopRequested(Exception):
    """``mnify run`` received SIGTERM or SIGHUP (raised in the main thread, as SIGINT raises
    KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise StopRequested(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass
class _Stop:
    """Stopping the job: the first signal, then SIGKILL for the whole session 5 s later."""

    proc: subprocess.Popen[bytes]
    at: float | None = None
    killed_at: float | None = None

    def begin(self, now: float, sig: int, whole_session: bool) -> None:
        if whole_session:
            session.signal_session(self.proc.pid, sig)
        else:
            session.signal_leader(self.proc.pid, sig)
        if self.at is None:
            self.at = now

    def kill(self, now: float) -> None:
        session.kill_session(self.proc.pid)
        self.killed_at = now
        if self.at is None:
            self.at = now

    def give_up_reading(self, now: float) -> bool:
        """Escalate when due; True once mpiexec is gone and its pipes are still held open by
        something outside the session."""
        if self.at is None:
            return False
        if now - self.at > _KILL_AFTER and (self.killed_at is None or now - self.killed_at > 1):
            self.kill(now)
        return self.proc.poll() is not None and now - self.at > _KILL_AFTER + 3


_KILL_AFTER = 5.0
_POLL_STATES = 0.5


def _run(
    command: LaunchCommand,
    env: dict[str, str],
    flavor: Flavor,
    nprocs: int,
    out: TextIO,
    err: TextIO,
    tag_output: bool,
    hold_seconds: float,
    abort_timeout: float,
    exit_timeout: float,
    state_dir: str,
    cwd: str | None,
) -> JobResult:
    janitor = Janitor()  # removes the job's files should mnify run be SIGKILLed
    started = time.time()
    janitor.since(started)
    proc = subprocess.Popen(
        command.argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # a SIGKILLed ``mnify run`` cannot stop the job: mpiexec then stops it itself
        preexec_fn=parent_death.preexec(signal.SIGTERM),
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
    watch = EarlyExitWatch(state_dir, nprocs, exit_timeout)
    processes = JobProcesses(proc.pid, nprocs)
    janitor.pid(proc.pid)
    for path in processes.files():
        janitor.file(path)
    stop = _Stop(proc)
    interrupted_by: int | None = None
    stranded: StrandedRanks | None = None
    stopped_after_failure = False
    launcher_outlived = False
    announced = False
    next_poll = 0.0
    open_streams = len(readers)
    while open_streams:
        try:
            open_streams -= pump.next(lines)
            pump.release_stale(hold_seconds)
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + _POLL_STATES
                found = watch.poll(now)
                if watch.first_overlap is not None and not announced:
                    announced = True
                    _say(err, _left_early_message(watch.first_overlap, exit_timeout))
                if found is not None and stop.at is None:
                    stranded = found
                    _say(err, _stranded_message(found))
                    stop.begin(now, signal.SIGTERM, whole_session=True)
                quiet = (
                    stop.at is None
                    and pump.collector.first_fatal() is None
                    and not pump.collector.exits
                    and proc.poll() is None
                )
                exiting = {r for r in range(nprocs) if watch.exiting(r)}
                processes.observe(now, watch.pids(), exiting, quiet)
                for rank_pid in watch.pids().values():
                    janitor.pid(rank_pid)
                for path in processes.files():
                    janitor.file(path)
                if stop.at is None and processes.launcher_outlived_ranks(now):
                    _say(
                        err,
                        f"mnify run: every rank has ended but mpiexec (pid {proc.pid}) still runs "
                        f"{LAUNCHER_GRACE:g} s later; ending it (the verdict comes from the ranks)",
                    )
                    launcher_outlived = True
                    stop.kill(now)
            fatal = pump.collector.first_fatal()
            if stop.at is None and fatal is not None and fatal.seen_at + abort_timeout <= now:
                _say(
                    err,
                    f"mnify run: rank {fatal.rank} failed {abort_timeout:g} s ago and mpiexec "
                    "has not ended the job; stopping it",
                )
                stopped_after_failure = True
                stop.begin(now, signal.SIGTERM, whole_session=True)
            if stop.give_up_reading(now):
                break  # something outside the session still holds the pipes
        except KeyboardInterrupt:
            # mpiexec has its own session, so pass the interrupt on; it stops the ranks. Keep
            # reading until it has, so their last words (and the summary) still appear. A
            # second Ctrl-C kills the whole job at once.
            if interrupted_by is not None:
                stop.kill(time.monotonic())
            else:
                interrupted_by = signal.SIGINT
                stop.begin(time.monotonic(), signal.SIGINT, whole_session=False)
        except StopRequested as request:
            if interrupted_by is not None:
                stop.kill(time.monotonic())
            else:
                interrupted_by = request.signum
                stop.begin(time.monotonic(), signal.SIGTERM, whole_session=True)
    returncode = _wait(proc, stop)
    launcher_signal = -returncode if returncode < 0 and stop.at is None else None
    session.kill_session(proc.pid)  # ranks orphaned by an mpiexec that has gone
    _wait_for_ranks(watch.pids())
    watch.poll(time.monotonic())
    reclaimed = mpi_files.reclaim(processes.files())
    reclaimed += mpi_files.remove(
        f.path for f in mpi_files.find_leftovers(min_age=0, created_after=started)
    )  # the job's segments it ended too early to be seen with
    reclaimed += mpi_files.remove(
        leftover.path for leftover in mpi_files.find_leftovers()
    )  # what earlier jobs, killed with their launcher, left behind
    janitor.done()
    return JobResult(
        returncode=returncode,
        tracebacks=pump.finish(),
        launcher_text="\n".join(pump.launcher),
        stderr_by_rank=pump.stderr_by_rank,
        interrupted_by=interrupted_by,
        stopped_after_failure=stopped_after_failure,
        stranded=stranded,
        exit_reports=list(pump.collector.exits),
        ranks_heard=frozenset(pump.ranks_heard | watch.started()),
        stops=list(pump.collector.stops),
        verify_reports=list(pump.collector.verify_reports),
        write_net_reports=list(pump.collector.write_net_reports),
        left_early=watch.first_overlap if stranded is None else None,
        launcher_outlived_ranks=launcher_outlived,
        launcher_signal=launcher_signal,
        vanished=processes.vanished,
        exit_statuses={r: rec.status for r, rec in watch.records.items() if watch.exiting(r)},
        reclaimed=[str(p) for p in reclaimed],
    )


def _wait_for_ranks(pids: dict[int, int], timeout: float = 5.0) -> None:
    """Wait until the SIGKILLed ranks are gone (orphans are reaped by init, not by us), so their
    files are no longer held when they are reclaimed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(mpi_files.pid_alive(p) for p in pids.values()):
        time.sleep(0.05)


def _wait(proc: subprocess.Popen[bytes], stop: _Stop) -> int:
    """mpiexec's exit status; a signal now kills the whole session."""
    while True:
        try:
            return proc.wait()
        except (KeyboardInterrupt, StopRequested):
            stop.kill(time.monotonic())


def _left_early_message(found: StrandedRanks, exit_timeout: float) -> str:
    left = ", ".join(f"rank {r} exited with status {s}" for r, s in found.exited.items())
    waiting = ",".join(str(r) for r in found.waiting)
    if exit_timeout > 0:
        left_s = max(0.0, exit_timeout - found.seconds)
        then = f"ending the job in {left_s:.0f} s unless they go on (--exit-timeout)"
    else:
        then = "not ending the job (--exit-timeout 0)"
    return f"mnify run: {left} while rank(s) {waiting} wait for it in {found.kind} #{found.seq}; {then}"


def _stranded_message(found: StrandedRanks) -> str:
    left = ", ".join(f"rank {r} exited with status {s}" for r, s in found.exited.items())
    waiting = ",".join(str(r) for r in found.waiting)
    return (
        f"mnify run: {left} while rank(s) {waiting} waited in {found.kind} #{found.seq} for "
        f"{found.seconds:.0f} s; stopping the job"
    )


def _say(err: TextIO, text: str) -> None:
    try:
        err.write(text + "\n")
        err.flush()
    except (OSError, ValueError):
        pass  # the terminal is gone (SIGHUP): the job must still be stopped
