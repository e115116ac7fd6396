"""``mnify run`` on real ranks: the console script through a subprocess, and click's CliRunner.

Jobs that must fail are bounded by a subprocess timeout well below the sleeping rank's 60 s, so
"the job ends instead of hanging" is checked without timing anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from mnify.cli import main
from mnify.launch.hosts import physical_cores
from tests.cli_run.console import MNIFY, SCRIPT, mnify_run, rank_env

TRACEBACK = "Traceback (most recent call last)"
pytestmark = pytest.mark.mpi


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, ["run", *args], env=rank_env(), catch_exceptions=False)


@pytest.mark.smoke
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


@pytest.mark.smoke
def test_plain_mpi4py_script_failing_on_one_rank_ends_instead_of_hanging() -> None:
    proc = mnify_run("-n", "2", str(SCRIPT), "plain_one", timeout=60)
    assert proc.returncode != 0, proc.stderr
    assert "error on rank 1 (of 2)" in proc.stderr, proc.stderr
    assert "LookupError: rank-specific shard is missing" in proc.stderr


@pytest.mark.parametrize("hold", ["0.2", "30"])
def test_handled_traceback_of_a_successful_job_is_shown_once(hold: str) -> None:
    # hold 0.2: released while the job still runs; hold 30: released when the job has ended
    result = invoke("-n", "2", "--hold-seconds", hold, str(SCRIPT), "handled")
    assert result.exit_code == 0, result.output
    assert result.stderr.count(TRACEBACK) == 1, result.stderr
    assert "KeyError: 'missing'" in result.stderr
    assert {"done 0", "done 1"} <= set(result.stdout.splitlines())
    assert "the job failed" not in result.stderr


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
    assert command.startswith(f"{fake} --oversubscribe ")  # no rank tags the user did not ask for
    assert f"--mca btl tcp,self -n {n} {sys.executable} -m mnify.launch.bootstrap" in command
    assert command.endswith(f"{SCRIPT} ok --out 'a b'")
    assert "export MNIFY_WATCHDOG_TIMEOUT=30" in result.stdout
    assert "-x MNIFY_WATCHDOG_TIMEOUT" in command
    if os.geteuid() == 0:
        assert "export OMPI_ALLOW_RUN_AS_ROOT=1" in result.stdout


def test_dry_run_tags_rank_output_only_when_asked(tmp_path: Path) -> None:
    fake, _ = _fake_mpiexec(tmp_path)
    plain = invoke("-n", "2", "--dry-run", "--mpiexec", str(fake), str(SCRIPT))
    tagged = invoke("-n", "2", "--dry-run", "--tag-output", "--mpiexec", str(fake), str(SCRIPT))
    assert "--tag-output" not in plain.stdout.split()
    assert "--tag-output" in tagged.stdout.strip().splitlines()[-1].split()


def test_options_after_the_script_belong_to_it() -> None:
    proc = mnify_run("-n", "2", str(SCRIPT), "ok", "-v", "--np", "3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 of 2 args=['-v', '--np', '3', '--dry-run']" in proc.stdout.splitlines()


def test_an_unknown_option_before_the_script_is_a_usage_error(tmp_path: Path) -> None:
    fake, marker = _fake_mpiexec(tmp_path)
    result = CliRunner().invoke(
        main, ["run", "-n", "2", "--mpiexec", str(fake), "-v", str(SCRIPT)], env=rank_env()
    )
    assert result.exit_code == 2
    assert "No such option '-v'" in result.stderr and "script not found" not in result.stderr
    assert not marker.exists()


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
        [*cmd, str(SCRIPT), "ok"], capture_output=True, text=True, timeout=60, env=rank_env()
    )
    assert done.returncode != 0, done.stderr
    assert "rank 1 failed 1 s ago and mpiexec has not ended the job; stopping it" in done.stderr
    assert done.stderr.count("RuntimeError: boom") == 1, done.stderr
