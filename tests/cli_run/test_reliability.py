"""``mnify run`` never hangs and leaves nothing behind, whatever ends the job: a launcher that
outlives its ranks, a SIGKILLed launcher, a SIGKILLed ``mnify run``, a rank that leaves while the
others wait. Through the console script, on real ranks.

A launcher that hangs after its ranks is hard to provoke on demand (it is a race in Open MPI's
PMIx server), so it is stood in for by a wrapper around the real mpiexec that stays alive, pipes
open, after mpiexec has exited: to ``mnify run`` it is the same situation.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_run.console import (
    MNIFY,
    SCRIPT,
    launcher_of,
    live_in_session,
    rank_env,
    run_verdict,
)

pytestmark = pytest.mark.mpi
REAL_MPIEXEC = Path(sys.executable).parent / "mpiexec"
# "mnify run: rank 1 exited with status 0 while rank(s) 0,2 wait for it in allreduce #2; ending
# the job in 59 s unless they go on (--exit-timeout)"
_LEFT_EARLY = re.compile(
    r"^mnify run: rank (?P<rank>\d+) exited with status (?P<status>\d+) while rank\(s\) "
    r"(?P<waiting>[\d,]+) wait for it in (?P<kind>\w+) #\d+; ending the job in (?P<left>\d+) s"
)


def _hanging_launcher(tmp_path: Path, drop_stderr: bool) -> Path:
    """An mpiexec that keeps running (and holding the output pipes) after the job."""
    wrapper = tmp_path / "mpiexec"
    quiet = " 2>/dev/null" if drop_stderr else ""
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then exec {REAL_MPIEXEC} "$@"; fi\n'
        f'{REAL_MPIEXEC} "$@"{quiet}\n'
        "sleep 600\n",
        encoding="utf-8",
    )
    wrapper.chmod(0o755)
    return wrapper


def _shm_of(pids: list[int]) -> set[str]:
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        found |= {
            line.split(maxsplit=5)[5]
            for line in maps.splitlines()
            if "/dev/shm/sm_segment" in line and len(line.split(maxsplit=5)) == 6
        }
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _until(condition: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return bool(condition())  # type: ignore[operator]


def test_a_launcher_outliving_successful_ranks_is_ended_and_the_job_succeeds(
    tmp_path: Path,
) -> None:
    launcher = _hanging_launcher(tmp_path, drop_stderr=False)
    v = run_verdict(
        tmp_path / "v.json", "--mpiexec", str(launcher), "-n", "2", str(SCRIPT), "ok", timeout=120
    )
    assert v.returncode == 0, v.describe()
    assert v.summary["category"] == "ok", v.describe()
    assert any(line.startswith("mnify run: every rank has ended") for line in v.stderr.splitlines())


def test_a_silent_launcher_outliving_a_killed_rank_still_names_the_rank(tmp_path: Path) -> None:
    """Rank 1 dies after the others ended their scripts (how the real hang starts); the
    launcher reports nothing (its stderr is gone) and hangs: the rank whose process died before
    its script ended is the culprit, the ranks that had finished are not."""
    launcher = _hanging_launcher(tmp_path, drop_stderr=True)
    v = run_verdict(
        tmp_path / "v.json",
        "--mpiexec",
        str(launcher),
        "-n",
        "3",
        str(SCRIPT),
        "kill_late",
        timeout=120,
    )
    assert (v.summary.get("category"), v.summary.get("culprit_ranks")) == ("killed", [1])
    assert v.returncode == v.summary["exit_status"] != 0, v.describe()


def _start(n: int, summary: Path) -> tuple[subprocess.Popen[str], int, list[int]]:
    """``mnify run -n N ... wait``, once every rank is ready: (mnify run, mpiexec, job pids)."""
    proc = subprocess.Popen(
        [str(MNIFY), "run", "-n", str(n), "--summary-json", str(summary), str(SCRIPT), "wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=rank_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready = {proc.stdout.readline().strip() for _ in range(n)}
    assert ready == {f"ready {r}" for r in range(n)}, ready
    mpiexec = launcher_of(proc.pid)
    return proc, mpiexec, live_in_session(mpiexec)


@pytest.mark.parametrize("n", [2, 3])
def test_sigkill_of_mnify_run_takes_the_job_and_its_files(n: int, tmp_path: Path) -> None:
    proc, mpiexec, job = _start(n, tmp_path / "v.json")
    segments = _shm_of(job)
    session_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"ompi.{mpiexec}"
    try:
        assert len(job) >= n + 1 and len(segments) >= n, (job, segments)
        proc.kill()
        proc.wait()
        assert _until(lambda: not any(_alive(p) for p in job), 30), job
        assert _until(lambda: not any(os.path.exists(s) for s in segments), 40), segments
        assert _until(lambda: not session_dir.exists(), 10), session_dir
    finally:
        for pid in job:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()


@pytest.mark.parametrize("n", [2, 3])
def test_a_killed_launcher_is_named_and_leaves_nothing(n: int, tmp_path: Path) -> None:
    summary = tmp_path / "v.json"
    proc, mpiexec, job = _start(n, summary)
    segments = _shm_of(job)
    try:
        os.kill(mpiexec, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    data = json.loads(summary.read_text())
    assert (data["category"], data["culprit_ranks"]) == ("killed", []), err
    assert data["headline"] == "the launcher was killed by signal 9 (SIGKILL)", err
    assert proc.returncode == 128 + 9
    assert [p for p in job if _alive(p)] == []
    assert not any(os.path.exists(s) for s in segments), segments
    assert not (Path(os.environ.get("TMPDIR", "/tmp")) / f"ompi.{mpiexec}").exists()


@pytest.mark.parametrize("n", [2, 3])
def test_an_early_exit_is_announced_at_once_and_is_the_verdict_under_the_watchdog(
    n: int, tmp_path: Path
) -> None:
    """The watchdog ends the job (the waiting ranks time out) before --exit-timeout would;
    the verdict still names the rank that left, and a line said so as soon as it happened."""
    v = run_verdict(tmp_path / "v.json", "-n", str(n), "--watchdog", "4", str(SCRIPT), "exit_early")
    assert (v.summary["category"], v.summary["culprit_ranks"]) == ("rank-exited", [1])
    assert v.summary["waiting_ranks"] == [r for r in range(n) if r != 1], v.describe()
    notices = [m for line in v.stderr.splitlines() if (m := _LEFT_EARLY.match(line))]
    assert len(notices) == 1, v.describe()
    notice = notices[0]
    assert (notice["rank"], notice["status"], notice["kind"]) == ("1", "0", "allreduce")
    assert [int(r) for r in notice["waiting"].split(",")] == v.summary["waiting_ranks"]
    assert 0 < int(notice["left"]) <= 60  # the default --exit-timeout, less the time waited
    stderr_lines = v.stderr.splitlines()
    assert stderr_lines.index(notices[0].string) < stderr_lines.index(
        next(line for line in stderr_lines if line.startswith("mnify run: the job failed"))
    )


def test_open_mpis_interactive_abort_text_never_reaches_the_user(tmp_path: Path) -> None:
    v = run_verdict(
        tmp_path / "v.json", "-n", "3", "--exit-timeout", "1", str(SCRIPT), "exit_early"
    )
    assert (v.summary["category"], v.summary["culprit_ranks"]) == ("rank-exited", [1])
    assert not [line for line in v.stderr.splitlines() if "hit ctrl-c" in line.lower()], v.stderr
