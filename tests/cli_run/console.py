"""Running ``mnify run`` as a user does (the console script in a subprocess), and reading what
it left: its exit status, its ``--summary-json`` verdict, how long after the failure it ended,
and the processes of its job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).parent / "scripts" / "scenarios.py"
MNIFY = Path(sys.executable).parent / "mnify"
_FAILING = re.compile(r"^FAILING (?P<at>\d+\.\d+)$", re.M)


def rank_env(grace: float = 0.5, **extra: str) -> dict[str, str]:
    """Quiet BLAS threads; the abort grace lets ranks failing alike all print first."""
    env = dict(os.environ)
    env.update(
        {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MNIFY_ABORT_GRACE": f"{grace:g}"}
    )
    for name in ("MNIFY_WATCHDOG_TIMEOUT", "MNIFY_DEBUG"):
        env.pop(name, None)
    env.update(extra)
    return env


def mnify_run(
    *args: str, timeout: float = 90, grace: float = 0.5, **env: str
) -> subprocess.CompletedProcess[str]:
    """The real console script, as a user runs it."""
    return subprocess.run(
        [str(MNIFY), "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=rank_env(grace, **env),
        stdin=subprocess.DEVNULL,
    )


@dataclass
class Verdict:
    """A finished ``mnify run``: what it printed, its verdict, and how fast it ended."""

    returncode: int
    stdout: str
    stderr: str
    summary: dict[str, Any]
    seconds_after_failure: float | None  # from the first FAILING line to the end of the job

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_verdict(
    summary: Path, *args: str, timeout: float = 120, grace: float = 0.5, **env: str
) -> Verdict:
    """``mnify run --summary-json SUMMARY ARGS...``, timed from the scenario's failure."""
    proc = mnify_run("--summary-json", str(summary), *args, timeout=timeout, grace=grace, **env)
    ended = time.time()
    marks = [float(m.group("at")) for m in _FAILING.finditer(proc.stdout)]
    data = json.loads(summary.read_text()) if summary.exists() else {}
    after = ended - min(marks) if marks else None
    return Verdict(proc.returncode, proc.stdout, proc.stderr, data, after)


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[-1].split()  # state ppid pgrp session ...


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children(pid: int) -> list[int]:
    return [p for p in _pids() if (f := _stat(p)) is not None and f[1] == str(pid)]


def launcher_of(run_pid: int) -> int:
    """The mpiexec ``mnify run`` started (its other child is the janitor, a Python process)."""
    found = []
    for pid in children(run_pid):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if not name.startswith("python"):
            found.append(pid)
    [launcher] = found
    return launcher


def live_in_session(sid: int) -> list[int]:
    """Processes of session ``sid`` that are still alive (zombies are already dead)."""
    return [p for p in _pids() if (f := _stat(p)) is not None and f[3] == str(sid) and f[0] != "Z"]
