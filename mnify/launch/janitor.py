"""Removing a job's Open MPI files after ``mnify run`` itself was SIGKILLed.

A SIGKILLed ``mnify run`` ends its launcher (the parent-death signal,
:mod:`mnify.launch.parent_death`), and the launcher stops its ranks, but neither removes the
job's ``/dev/shm`` segments nor the launcher's ``TMPDIR/ompi.PID``. So ``mnify run`` starts a
small helper process beside the job (``python -m mnify.launch.janitor``, its own session, so
neither Ctrl-C nor the job's stop reaches it) and tells it, one line at a time on its stdin,
what the job's files and processes are, and when it started (the segments it made that nobody
holds at the end are its own, even those it was not told of). ``done`` means ``mnify run`` has cleaned up itself. At
end of input without ``done`` (``mnify run`` died), the janitor waits for the job's processes to
end (at most ``WAIT_FOR_JOB`` seconds) and reclaims the files nobody holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from mnify.runtime import mpi_files

WAIT_FOR_JOB = 30.0


class Janitor:
    """``mnify run``'s end of the helper: tell it about the job; ``done`` when clean."""

    def __init__(self) -> None:
        self._told: set[str] = set()
        try:
            self.proc: subprocess.Popen[str] | None = subprocess.Popen(
                [sys.executable, "-m", "mnify.launch.janitor"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": _package_root(os.environ.get("PYTHONPATH"))},
            )
        except OSError:
            self.proc = None

    def _send(self, line: str) -> None:
        if self.proc is None or self.proc.stdin is None or line in self._told:
            return
        self._told.add(line)
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self.proc = None

    def pid(self, pid: int) -> None:
        self._send(f"pid {pid}")

    def file(self, path: Path | str) -> None:
        self._send(f"file {path}")

    def since(self, started: float) -> None:
        """The job started at ``started`` (``time.time()``): unheld segments made since then
        are the job's."""
        self._send(f"since {started!r}")

    def done(self) -> None:
        self._send("done")
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _package_root(existing: str | None) -> str:
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (root, existing or "") if p)


def serve(stream: IO[str]) -> None:
    pids: list[int] = []
    files: list[Path] = []
    since: float | None = None
    for raw in stream:
        word, _, rest = raw.strip().partition(" ")
        if word == "done":
            return
        if word == "pid" and rest.isdigit():
            pids.append(int(rest))
        elif word == "file" and rest:
            files.append(Path(rest))
        elif word == "since":
            try:
                since = float(rest)
            except ValueError:
                pass
    deadline = time.monotonic() + WAIT_FOR_JOB
    while time.monotonic() < deadline and any(mpi_files.pid_alive(p) for p in pids):
        time.sleep(0.1)
    mpi_files.reclaim(files)
    if since is not None:
        # the job's segments that were not known yet (killed right after it started)
        mpi_files.remove(f.path for f in mpi_files.find_leftovers(min_age=0, created_after=since))


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only end of input ends it
    serve(sys.stdin)


if __name__ == "__main__":
    main()
