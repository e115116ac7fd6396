"""The fault table: every way a job can fail, through ``mnify run`` as a user runs it.

    python scripts/fault_table.py                 # 3 ranks, 5 repetitions of every fault
    python scripts/fault_table.py --reps 3 --only exception,kill-launcher --json table.json

For each fault and repetition it records whether the job ended (``mnify run`` exited within the
bound and left no process of its job alive), how many seconds that took after the fault (the
scenario's ``FAILING`` line, or the signal sent), the verdict's category and culprit ranks
(``--summary-json``; none when ``mnify run`` itself was SIGKILLed), and what outlived the job: its
processes (mpiexec's session), its ``/dev/shm`` segments (read from the ranks' memory maps while
they ran) and the launcher's ``TMPDIR/ompi.PID`` directory, checked two seconds after the end.
The rank behaviours are tests/cli_run/scripts/scenarios.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "tests" / "cli_run" / "scripts" / "scenarios.py"
MNIFY = Path(sys.executable).parent / "mnify"
BOUND = 90.0  # seconds a job may take to end before it counts as hung

# fault -> (mnify run options, scenario, signal sent to mnify run or the launcher, whom)
FAULTS: dict[str, tuple[list[str], str, int | None, str]] = {
    "exception": ([], "raise_one", None, ""),
    "sigkill-rank": ([], "kill_one", None, ""),
    "sigstop-watchdog": (["--watchdog", "3"], "stop_one", None, ""),
    "early-exit-0": (["--exit-timeout", "5"], "exit_early", None, ""),
    "loop-watchdog": (["--watchdog", "3"], "loop_one", None, ""),
    "sigterm-run": ([], "wait", signal.SIGTERM, "run"),
    "sigint-run": ([], "wait", signal.SIGINT, "run"),
    "sigkill-run": ([], "wait", signal.SIGKILL, "run"),
    "sigkill-launcher": ([], "wait", signal.SIGKILL, "launcher"),
}
_FAILING = re.compile(r"^FAILING (?P<at>\d+\.\d+)$", re.M)


@dataclass
class Row:
    fault: str
    rep: int
    ended: bool
    seconds: float | None
    category: str | None
    culprit: list[int] | None
    leftover_processes: int
    leftover_shm: list[str] = field(default_factory=list)
    leftover_tmp: list[str] = field(default_factory=list)
    exit_status: int | None = None
    job_processes_seen: int = 0  # mpiexec and the ranks, found while the job ran
    segments_seen: int = 0  # the job's /dev/shm segments, found in the ranks' memory maps


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[-1].split()  # state ppid pgrp session ...


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _session(sid: int) -> list[int]:
    return [p for p in _pids() if (f := _stat(p)) is not None and f[3] == str(sid) and f[0] != "Z"]


def _children(pid: int) -> list[int]:
    return [p for p in _pids() if (f := _stat(p)) is not None and f[1] == str(pid)]


def _launcher(run_pid: int) -> int | None:
    """mnify run's child running mpiexec (the others: its janitor, ``mpiexec --version``):
    the leader of a session of its own with children (the ranks)."""
    for pid in _children(run_pid):
        fields = _stat(pid)
        if fields is None or fields[3] != str(pid):
            continue  # not a session leader: not (yet) the job's mpiexec
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if not name.startswith("python") and _children(pid):
            return pid
    return None


def _shm_maps(pid: int) -> set[str]:
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {
        line.split(maxsplit=5)[5].removesuffix(" (deleted)")
        for line in text.splitlines()
        if "/dev/shm/" in line and len(line.split(maxsplit=5)) == 6
    }


class _Sampler(threading.Thread):
    """Finds mpiexec (mnify run's child) and the job's processes and segments while it runs."""

    def __init__(self, run_pid: int) -> None:
        super().__init__(daemon=True)
        self.run_pid = run_pid
        self.launcher: int | None = None
        self.pids: set[int] = set()
        self.segments: set[str] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if self.launcher is not None and not self.pids and not _alive(self.launcher):
                self.launcher = None  # a short-lived child (``mpiexec --version``), not the job
            if self.launcher is None:
                self.launcher = _launcher(self.run_pid)
            if self.launcher is not None:
                for pid in _session(self.launcher):
                    self.pids.add(pid)
                    self.pids.add(self.launcher)
                    if pid != self.launcher:
                        self.segments |= _shm_maps(pid)
            self.done.wait(0.1)


def run_fault(fault: str, rep: int, nprocs: int, workdir: Path) -> Row:
    options, scenario, sig, whom = FAULTS[fault]
    summary = workdir / f"{fault}-{rep}.json"
    summary.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MNIFY_ABORT_GRACE="0.5")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    argv = [str(MNIFY), "run", "-n", str(nprocs), "--summary-json", str(summary), *options]
    proc = subprocess.Popen(
        [*argv, str(SCENARIOS), scenario],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    sampler = _Sampler(proc.pid)
    sampler.start()
    out_lines: list[str] = []
    fault_at: float | None = None
    assert proc.stdout is not None and proc.stderr is not None
    err_chunks: list[str] = []
    threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True).start()
    deadline = time.monotonic() + BOUND
    if sig is not None:
        ready = 0
        while ready < nprocs and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out_lines.append(line)
            ready += line.startswith("ready ")
        time.sleep(0.5)  # let the sampler see the ranks' segments
        if whom == "run":
            target = -proc.pid if sig == signal.SIGINT else proc.pid  # Ctrl-C: the whole group
        else:
            target = sampler.launcher or 0
        fault_at = time.time()
        try:
            if target > 0:
                os.kill(target, sig)
            elif target < 0:
                os.killpg(-target, sig)
        except ProcessLookupError:
            fault_at = None  # not delivered: the row shows no time
    ended = True
    if sig == signal.SIGKILL and whom == "run":
        proc.wait()
        # mnify run is gone: the job has ended when its launcher's session is empty
        while sampler.launcher is not None and _session(sampler.launcher):
            if time.monotonic() > deadline:
                ended = False
                break
            time.sleep(0.05)
        end = time.time()
    else:
        reader = threading.Thread(target=lambda: out_lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ended = False
            os.killpg(proc.pid, signal.SIGKILL)
            if sampler.launcher:
                os.killpg(sampler.launcher, signal.SIGKILL)
            proc.wait()
        end = time.time()
        reader.join(timeout=5)
    sampler.done.set()
    sampler.join(timeout=5)
    marks = [float(m.group("at")) for m in _FAILING.finditer("".join(out_lines))]
    start = fault_at if fault_at is not None else (min(marks) if marks else None)
    time.sleep(2.0)
    leftover = sorted(p for p in sampler.pids if _alive(p))
    tmp = Path(tempfile.gettempdir())
    leftover_tmp = (
        [str(tmp / f"ompi.{sampler.launcher}")]
        if sampler.launcher and (tmp / f"ompi.{sampler.launcher}").exists()
        else []
    )
    data = json.loads(summary.read_text()) if summary.exists() else {}
    row = Row(
        fault=fault,
        rep=rep,
        ended=ended and not leftover,
        seconds=round(end - start, 2) if start is not None else None,
        category=data.get("category"),
        culprit=data.get("culprit_ranks"),
        leftover_processes=len(leftover),
        leftover_shm=sorted(s for s in sampler.segments if os.path.exists(s)),
        leftover_tmp=leftover_tmp,
        exit_status=proc.returncode,
        job_processes_seen=len(sampler.pids),
        segments_seen=len(sampler.segments),
    )
    if os.environ.get("FAULT_TABLE_VERBOSE"):
        print("".join(err_chunks), file=sys.stderr)
    return row


def render(rows: list[Row]) -> str:
    head = (
        "| fault | rep | ended | s | category | culprit | exit | procs seen/left "
        "| shm seen/left | tmp left |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r.fault} | {r.rep} | {'yes' if r.ended else 'NO'} | {r.seconds} | "
            f"{r.category or '-'} | {r.culprit if r.culprit is not None else '-'} | "
            f"{r.exit_status} | {r.job_processes_seen}/{r.leftover_processes} | "
            f"{r.segments_seen}/{len(r.leftover_shm)} | "
            f"{len(r.leftover_tmp)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("-n", "--ranks", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated faults (default: all)")
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    faults = [f for f in args.only.split(",") if f] or list(FAULTS)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="mnify-faults-") as workdir:
        for fault in faults:
            for rep in range(args.reps):
                row = run_fault(fault, rep, args.ranks, Path(workdir))
                rows.append(row)
                print(render([row]).splitlines()[-1], flush=True)
    print()
    print(render(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
