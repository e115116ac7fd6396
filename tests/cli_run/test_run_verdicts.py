"""``mnify run``'s verdict on real ranks, through the console script: for every way a job ends,
the category, the culprit ranks and the hint of ``--summary-json``, and how long the job took to
end after the failure (a generous bound; the measured time is recorded as a test property).

The watchdog and the early-exit stop run with short timeouts (``--watchdog 3 --exit-timeout
3``); a rank that sleeps sleeps 60 s, so "ends within the bound" also means "did not hang".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli_run.console import (
    MNIFY,
    SCRIPT,
    Verdict,
    launcher_of,
    live_in_session,
    rank_env,
    run_verdict,
)

pytestmark = pytest.mark.mpi
TRACEBACK = "Traceback (most recent call last)"
FAST = ("--watchdog", "3", "--exit-timeout", "3")
# from the failure to the end of the job, on a loaded 2-core machine; a hang would take 60 s+
BOUND = 45.0
Record = Callable[[str, object], None]


@pytest.fixture
def verdict(tmp_path: Path, record_property: Record) -> Callable[..., Verdict]:
    """Run ``mnify run`` with a summary file; record how long it took to end after the failure."""

    def run(*args: str, grace: float = 0.5, **env: str) -> Verdict:
        result = run_verdict(tmp_path / "verdict.json", *args, grace=grace, **env)
        if result.seconds_after_failure is not None:
            record_property("failure_to_end_s", round(result.seconds_after_failure, 2))
            assert result.seconds_after_failure < BOUND, result.describe()
        return result

    return run


def others(n: int, *but: int) -> list[int]:
    return [r for r in range(n) if r not in but]


def first_line(v: Verdict) -> str:
    """The summary's first line (messages of the launcher itself may come before it)."""
    return next(line for line in v.stderr.splitlines() if line.startswith("mnify run: the job"))


def assert_verdict(v: Verdict, category: str, culprits: list[int], hint: str) -> None:
    s = v.summary
    assert (s.get("category"), s.get("culprit_ranks")) == (category, culprits), v.describe()
    assert hint in s["hint"], s["hint"]
    assert v.returncode == s["exit_status"] != 0, v.describe()
    assert first_line(v).startswith(
        f"mnify run: the job failed (exit status {v.returncode}): {category}: "
    ), v.describe()


@pytest.mark.parametrize("n", [2, 3])
def test_ok_verdict_is_written_on_success(n: int, verdict: Callable[..., Verdict]) -> None:
    v = verdict("-n", str(n), str(SCRIPT), "ok")
    assert v.returncode == 0, v.describe()
    assert {k: v.summary[k] for k in ("schema", "exit_status", "category", "culprit_ranks")} == {
        "schema": 1,
        "exit_status": 0,
        "category": "ok",
        "culprit_ranks": [],
    }
    assert v.summary["errors"] == [] and "mnify run: the job" not in v.stderr
    assert v.summary["shared_writes"] == []  # the write net reported, and found nothing


@pytest.mark.parametrize("n", [2, 3])
def test_same_error_on_every_rank_is_one_error(n: int, verdict: Callable[..., Verdict]) -> None:
    v = verdict("-n", str(n), *FAST, str(SCRIPT), "raise_all", grace=2)
    assert_verdict(v, "same-error", list(range(n)), f"the same error on all {n} ranks")
    assert v.summary["shared_writes"] is None  # no normal end: the write net exchanged nothing
    [error] = v.summary["errors"]
    assert (error["type"], error["ranks"]) == ("ValueError", list(range(n)))
    assert v.stderr.count(TRACEBACK) == 1, v.stderr
    assert "scenarios.py" in v.stderr and "bootstrap.py" not in v.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_trainer_error_on_every_rank_is_the_same_error(
    n: int, verdict: Callable[..., Verdict]
) -> None:
    """Chainer's partial 'Exception in main training loop' traceback and the final one are one
    error, not two different ones."""
    v = verdict("-n", str(n), *FAST, str(SCRIPT), "train_raise_all", grace=2)
    assert_verdict(v, "same-error", list(range(n)), f"the same error on all {n} ranks")
    assert v.summary["shared_writes"] is None  # no normal end: the write net exchanged nothing
    [error] = v.summary["errors"]
    assert (error["type"], error["message"]) == ("ValueError", "learning rate must be positive")
    assert v.stderr.count(TRACEBACK) == 1, v.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_error_on_one_rank_is_rank_dependent(n: int, verdict: Callable[..., Verdict]) -> None:
    v = verdict("-n", str(n), *FAST, str(SCRIPT), "raise_one")
    assert_verdict(v, "rank-dependent", [1], f"only rank 1 of {n} reported an error")
    assert [e["type"] for e in v.summary["errors"]] == ["KeyError"]
    # Open MPI's abort boxes are summarised in one line instead of shown
    assert "MPI_ABORT was invoked" not in v.stderr and "NOTE: invoking MPI_ABORT" not in v.stderr
    assert v.summary["exits"] == [{"rank": 1, "how": "abort", "code": 1}]


@pytest.mark.parametrize("n", [2, 3])
def test_debug_mismatch_names_the_rank_that_differs(
    n: int, verdict: Callable[..., Verdict]
) -> None:
    """On 2 ranks the two signatures tie and rank 0 is taken as right; on 3 rank 1 is the odd
    one out."""
    v = verdict("-n", str(n), *FAST, str(SCRIPT), "shapes", MNIFY_DEBUG="1")
    assert_verdict(v, "rank-dependent", [1], "rank 1 differed from the most common call")
    assert v.summary["errors"][0]["type"].endswith("CollectiveMismatch")


@pytest.mark.parametrize("n", [2, 3])
def test_shapes_differing_without_debug_suggest_debug_mode(
    n: int, verdict: Callable[..., Verdict]
) -> None:
    v = verdict("-n", str(n), *FAST, str(SCRIPT), "shapes")
    assert_verdict(v, "rank-dependent", [], "Run again with MNIFY_DEBUG=1")


@pytest.mark.parametrize("scenario", ["sleep_one", "train_sleep_one"])
@pytest.mark.parametrize("n", [2, 3])
def test_rank_that_never_arrives_is_the_culprit_of_a_communication_failure(
    n: int, scenario: str, verdict: Callable[..., Verdict]
) -> None:
    v = verdict("-n", str(n), *FAST, str(SCRIPT), scenario, grace=1)
    assert_verdict(v, "communication", [1], "timed out waiting for rank(s) 1")
    waiting = sorted(r for e in v.summary["errors"] for r in e["ranks"])
    assert waiting == others(n, 1), v.describe()
    assert {r for e in v.summary["errors"] for r in e["missing_ranks"]} == {1}
    assert v.stderr.count(TRACEBACK) == 1, v.stderr  # not once more as Chainer's echo
    assert "watchdog.py" not in v.stderr  # the runtime's frames are folded


@pytest.mark.parametrize("n", [2, 3])
def test_sys_exit_on_one_rank_is_a_rank_exit_with_its_status(
    n: int, verdict: Callable[..., Verdict]
) -> None:
    v = verdict("-n", str(n), *FAST, str(SCRIPT), "exit_code", "3")
    assert_verdict(v, "rank-exited", [1], "rank 1 exited with status 3")
    assert v.returncode == 3


@pytest.mark.parametrize("n", [2, 3])
def test_rank_leaving_early_with_status_0_ends_the_job(
    n: int, verdict: Callable[..., Verdict]
) -> None:
    """No watchdog: the runtime's rank states alone end the job, naming who left."""
    v = verdict("-n", str(n), "--exit-timeout", "3", str(SCRIPT), "exit_early")
    assert_verdict(v, "rank-exited", [1], "rank 1 exited with status 0")
    assert v.summary["waiting_ranks"] == others(n, 1)


def test_rank_entering_a_collective_after_another_left_is_stopped_too(
    verdict: Callable[..., Verdict],
) -> None:
    v = verdict("-n", "2", "--exit-timeout", "3", str(SCRIPT), "exit_then_enter")
    assert_verdict(v, "rank-exited", [1], "rank 1 exited with status 0")
    assert v.summary["waiting_ranks"] == [0]


@pytest.mark.parametrize("n", [2, 3])
def test_rank_0_working_alone_after_the_others_finished_is_never_stopped(
    n: int, verdict: Callable[..., Verdict]
) -> None:
    v = verdict("-n", str(n), "--exit-timeout", "3", str(SCRIPT), "tail")
    assert v.returncode == 0, v.describe()
    assert v.summary["category"] == "ok" and "tail done" in v.stdout.splitlines()


@pytest.mark.parametrize("n", [2, 3])
def test_rank_killed_by_a_signal(n: int, verdict: Callable[..., Verdict]) -> None:
    v = verdict("-n", str(n), *FAST, str(SCRIPT), "kill_one")
    assert_verdict(v, "killed", [1], "ran out of memory")


@pytest.mark.parametrize("n", [2, 3])
def test_unresolvable_host_is_a_launch_failure(n: int, verdict: Callable[..., Verdict]) -> None:
    v = verdict("-n", str(n), "--host", f"nosuchhost.invalid:{n}", str(SCRIPT), "ok")
    assert_verdict(v, "launch", [], "must resolve")
    assert "nosuchhost.invalid" in v.summary["headline"]


@pytest.mark.parametrize("n", [2, 3])
def test_garbage_hostfile_is_a_launch_failure(
    n: int, tmp_path: Path, verdict: Callable[..., Verdict]
) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("%%%garbage!! here\n", encoding="utf-8")
    v = verdict("-n", str(n), "--hostfile", str(hostfile), str(SCRIPT), "ok")
    assert_verdict(v, "launch", [], "hostfile")


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"]
)
@pytest.mark.parametrize("n", [2, 3])
def test_a_signal_to_mnify_run_stops_the_whole_job(
    n: int, sig: signal.Signals, tmp_path: Path, record_property: Record
) -> None:
    """What Ctrl-C, ``timeout``, a CI cancel or a batch system sends: every process of the job
    (found by session, mpiexec's and mnify run's own) is gone when mnify run exits 128+N."""
    summary = tmp_path / "verdict.json"
    proc = subprocess.Popen(
        [str(MNIFY), "run", "-n", str(n), "--summary-json", str(summary), str(SCRIPT), "wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=rank_env(),
        start_new_session=True,  # its own session and group, like a terminal's foreground job
    )
    try:
        assert proc.stdout is not None
        ready = {proc.stdout.readline().strip() for _ in range(n)}
        assert ready == {f"ready {r}" for r in range(n)}, ready
        mpiexec = launcher_of(proc.pid)  # the leader of the job's own session
        assert len(live_in_session(mpiexec)) >= n + 1  # mpiexec and the ranks
        sent = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C goes to the foreground process group
        else:
            proc.send_signal(sig)  # timeout, CI runners and batch systems signal the process
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    record_property("signal_to_end_s", round(took, 2))
    assert proc.returncode == 128 + sig, err
    assert took < 10, err
    assert live_in_session(mpiexec) == [] and live_in_session(proc.pid) == []
    data = json.loads(summary.read_text())
    assert (data["category"], data["culprit_ranks"], data["exit_status"]) == (
        "interrupted",
        [],
        128 + sig,
    )
    assert sig.name in data["hint"]
