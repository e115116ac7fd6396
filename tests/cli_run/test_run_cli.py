"""``mnify run`` on real ranks: the console script through a subprocess, and click's CliRunner.

Jobs that must fail are bounded by a subprocess timeout well below the sleeping rank's 60 s, so
"the job ends instead of hanging" is checked without timing anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from mnify.cli import main
from mnify.launch.hosts import physical_cores

SCRIPT = Path(__file__).parent / "scripts" / "scenarios.py"
MNIFY = Path(sys.executable).parent / "mnify"
TRACEBACK = "Traceback (most recent call last)"
pytestmark = pytest.mark.mpi


def _env(grace: float = 0.5) -> dict[str, str]:
    """Quiet BLAS threads; the abort grace lets ranks failing alike all print first."""
    env = dict(os.environ)
    env.update(
        {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MNIFY_ABORT_GRACE": f"{grace:g}"}
    )
    env.pop("MNIFY_WATCHDOG_TIMEOUT", None)
    return env


def mnify_run(
    *args: str, timeout: float = 90, grace: float = 0.5
) -> subprocess.CompletedProcess[str]:
    """The real console script, as a user runs it."""
    return subprocess.run(
        [str(MNIFY), "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(grace),
        stdin=subprocess.DEVNULL,
    )


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, ["run", *args], env=_env(), catch_exceptions=False)


def test_success_on_two_ranks_passes_output_untagged_and_exits_zero() -> None:
    proc = mnify_run("-n", "2", str(SCRIPT), "ok", "--lr", "0.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for r in range(2):
        assert f"rank {r} of 2 args=['--lr', '0.1']" in lines
        assert f"note from rank {r}" in proc.stderr.splitlines()
    assert "<stdout>" not in proc.stdout and "<stderr>" not in proc.stderr
    assert "failed" not in proc.stderr


def test_success_on_three_ranks_with_rank_tags() -> None:
    result = invoke("-n", "3", "--tag-output", str(SCRIPT), "ok")
    assert result.exit_code == 0, result.output
    for r in range(3):
        assert f"[{r}] rank {r} of 3 args=[]" in result.stdout.splitlines()
        assert f"[{r}] note from rank {r}" in result.stderr.splitlines()


@pytest.mark.parametrize("n", [2, 3])
def test_same_error_on_every_rank_collapses_into_one_traceback(n: int) -> None:
    proc = mnify_run("-n", str(n), str(SCRIPT), "raise_all", grace=2)
    err = proc.stderr
    assert proc.returncode != 0, err
    assert err.count(TRACEBACK) == 1, err
    assert err.count("ValueError: learning rate must be positive") == 1, err
    assert f"error on ranks 0-{n - 1} (all {n})" in err, err
    assert "same error on every rank" in err
    assert f"hint: the same error on all {n} ranks" in err
    assert "scenarios.py" in err and "bootstrap.py" not in err  # launcher frames dropped


def test_error_on_rank_one_only_names_rank_one() -> None:
    result = invoke("-n", "3", str(SCRIPT), "raise_one")
    err = result.stderr
    assert result.exit_code != 0, result.output
    assert err.count(TRACEBACK) == 1, err
    assert "error on rank 1 (of 3)" in err, err
    assert "KeyError: 'no shard for rank 1'" in err
    assert "only rank 1 of 3 reported an error" in err
    # Open MPI's abort boxes are summarised in one line instead of shown
    assert "MPI_ABORT was invoked" not in err and "NOTE: invoking MPI_ABORT" not in err
    assert "mpiexec: rank 1 called MPI_Abort (code 1)" in err


def test_plain_mpi4py_script_failing_on_one_rank_ends_instead_of_hanging() -> None:
    proc = mnify_run("-n", "2", str(SCRIPT), "plain_one", timeout=60)
    assert proc.returncode != 0, proc.stderr
    assert "error on rank 1 (of 2)" in proc.stderr, proc.stderr
    assert "LookupError: rank-specific shard is missing" in proc.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_watchdog_timeout_is_reported_as_a_communication_failure(n: int) -> None:
    proc = mnify_run("-n", str(n), "--watchdog", "2", str(SCRIPT), "sleep_one", timeout=50, grace=1)
    err = proc.stderr
    assert proc.returncode != 0, err
    assert "communication failure" in err, err
    assert err.count("Traceback (most recent call last)") == 1, err
    waiting = "rank 0 (of 2)" if n == 2 else "ranks 0,2 (of 3)"
    assert f"collective timeout on {waiting}" in err, err
    assert "timed out waiting for rank(s) 1" in err
    assert "Retry on one rank" in err


@pytest.mark.parametrize("hold", ["0.2", "30"])
def test_handled_traceback_of_a_successful_job_is_shown_once(hold: str) -> None:
    # hold 0.2: released while the job still runs; hold 30: released when the job has ended
    result = invoke("-n", "2", "--hold-seconds", hold, str(SCRIPT), "handled")
    assert result.exit_code == 0, result.output
    assert result.stderr.count(TRACEBACK) == 1, result.stderr
    assert "KeyError: 'missing'" in result.stderr
    assert {"done 0", "done 1"} <= set(result.stdout.splitlines())
    assert "the job failed" not in result.stderr


def test_ctrl_c_stops_every_rank_and_exits_130() -> None:
    proc = subprocess.Popen(
        [str(MNIFY), "run", "-n", "2", str(SCRIPT), "wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=_env(),
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    try:
        assert proc.stdout is not None
        ready = {proc.stdout.readline().strip() for _ in range(2)}
        assert ready == {"ready 0", "ready 1"}, ready
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground group
        _, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "the job failed" not in err


def _fake_mpiexec(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "launched"
    fake = tmp_path / "mpiexec"
    fake.write_text(
        f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'mpiexec (Open MPI) 5.0.0'; exit 0; fi\n"
        f"touch {marker}\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    return fake, marker


def test_missing_script_is_a_clear_error_and_launches_nothing(tmp_path: Path) -> None:
    fake, marker = _fake_mpiexec(tmp_path)
    result = invoke("-n", "2", "--mpiexec", str(fake), str(tmp_path / "nope.py"), "x")
    assert result.exit_code == 2
    assert f"error: script not found: {tmp_path / 'nope.py'}" in result.stderr
    assert not marker.exists()
    habit = invoke("-n", "2", "--mpiexec", str(fake), "python", str(SCRIPT))
    assert habit.exit_code == 2
    assert f"mnify run takes the script itself: mnify run -n 2 {SCRIPT}" in habit.stderr
    assert not marker.exists()


def test_dry_run_one_host_oversubscribes_beyond_the_cores(tmp_path: Path) -> None:
    fake, marker = _fake_mpiexec(tmp_path)
    n = physical_cores() + 1
    result = invoke(
        "-n", str(n), "--dry-run", "--watchdog", "30", "--mpiexec", str(fake),
        "--mpi-arg", "--mca btl tcp,self", str(SCRIPT), "ok", "--out", "a b",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not marker.exists()
    command = result.stdout.strip().splitlines()[-1]
    assert command.startswith(f"{fake} --tag-output --oversubscribe ")
    assert f"--mca btl tcp,self -n {n} {sys.executable} -m mnify.launch.bootstrap" in command
    assert command.endswith(f"{SCRIPT} ok --out 'a b'")
    assert "export MNIFY_WATCHDOG_TIMEOUT=30" in result.stdout
    assert "-x MNIFY_WATCHDOG_TIMEOUT" in command
    if os.geteuid() == 0:
        assert "export OMPI_ALLOW_RUN_AS_ROOT=1" in result.stdout


def test_dry_run_with_a_hostfile_never_oversubscribes(tmp_path: Path) -> None:
    fake, _ = _fake_mpiexec(tmp_path)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=4\nnode2 slots=4\n", encoding="utf-8")
    result = invoke(
        "-n", "8", "--dry-run", "--hostfile", str(hostfile), "--mpiexec", str(fake), str(SCRIPT), "ok"
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    command = result.stdout.strip().splitlines()[-1]
    assert f"--hostfile {hostfile}" in command
    assert "--oversubscribe" not in command
    too_many = invoke("-n", "9", "--dry-run", "--hostfile", str(hostfile), "--mpiexec", str(fake),
                      str(SCRIPT), "ok")  # fmt: skip
    assert "9 ranks but the hosts offer 8 slots" in too_many.stderr


def test_dry_run_with_host_list_and_usage_errors(tmp_path: Path) -> None:
    fake, _ = _fake_mpiexec(tmp_path)
    ok = invoke("-n", "4", "--dry-run", "--host", "a:2,b:2", "--mpiexec", str(fake), str(SCRIPT))
    assert "--host a:2,b:2" in ok.stdout and "--oversubscribe" not in ok.stdout
    both = invoke(
        "-n", "2", "--host", "a:1", "--hostfile", "h", "--mpiexec", str(fake), str(SCRIPT)
    )
    assert both.exit_code == 2 and "not both" in both.stderr
    unreadable = invoke("-n", "2", "--hostfile", str(tmp_path / "missing"), str(SCRIPT))
    assert unreadable.exit_code == 2 and "cannot read hostfile" in unreadable.stderr
    no_mpiexec = invoke("-n", "2", "--mpiexec", str(tmp_path / "none"), str(SCRIPT))
    assert no_mpiexec.exit_code == 2 and "not an executable" in no_mpiexec.stderr
    quote = invoke("-n", "2", "--mpiexec", str(fake), "--mpi-arg", "--mca 'x", str(SCRIPT))
    assert quote.exit_code == 2 and "--mpi-arg" in quote.stderr


@pytest.mark.parametrize(
    "stderr_lines",
    [
        # a rank announced its death, yet mpiexec exited 0 (seen with Open MPI 5.0.11)
        [
            "[1,1]<stderr>: [mnify] rank 1 (host mnb) failed:",
            f"[1,1]<stderr>: {TRACEBACK}",
            '[1,1]<stderr>:   File "train.py", line 3, in <module>',
            "[1,1]<stderr>: RuntimeError: boom",
        ],
        # a host dropped off the network and PRTE still exited 0
        ["PRTE has lost communication with a remote daemon."],
    ],
)
def test_a_failed_job_never_exits_zero(tmp_path: Path, stderr_lines: list[str]) -> None:
    fake = tmp_path / "mpiexec"
    body = "".join(f"echo '{line}' >&2\n" for line in stderr_lines)
    fake.write_text(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'mpiexec (Open MPI) 5.0.0'; exit 0; fi\n"
        f"{body}exit 0\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    result = invoke("-n", "2", "--mpiexec", str(fake), str(SCRIPT), "ok")
    assert result.exit_code == 1, result.stderr


def test_a_job_that_outlives_a_failed_rank_is_stopped(tmp_path: Path) -> None:
    """A rank announced its death but mpiexec (and a daemon it started) never end the job:
    ``mnify run`` stops the whole session after --abort-timeout instead of hanging."""
    fake = tmp_path / "mpiexec"
    fake.write_text(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'mpiexec (Open MPI) 5.0.0'; exit 0; fi\n"
        "sleep 300 &\n"  # a launch daemon that keeps the output pipes open
        "echo '[1,1]<stderr>: [mnify] rank 1 (host mnb) failed:' >&2\n"
        f"echo '[1,1]<stderr>: {TRACEBACK}' >&2\n"
        "echo '[1,1]<stderr>: RuntimeError: boom' >&2\n"
        "sleep 300\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    cmd = [str(MNIFY), "run", "-n", "2", "--abort-timeout", "1", "--mpiexec", str(fake)]
    done = subprocess.run(
        [*cmd, str(SCRIPT), "ok"], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert done.returncode != 0, done.stderr
    assert "rank 1 failed 1 s ago and mpiexec has not ended the job; stopping it" in done.stderr
    assert done.stderr.count("RuntimeError: boom") == 1, done.stderr
