"""``mnify run --verify`` on real ranks, through the console script, on scripts written the way
researchers write them (tests/verify/scripts/): each wrong one is named by the right check with
the right ranks and the user's line, exits 1 and ends within a minute; each right one gets no
finding and exits 0. Also: ``MNIFY_VERIFY=K`` under a plain mpiexec, and nothing installed when
verification is off.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run.console import MNIFY, rank_env
from tests.support.mpirun import run_ranks

pytestmark = pytest.mark.mpi
SCRIPTS = Path(__file__).resolve().parent / "scripts"
BOUND = 60.0  # the "ends within a minute"; runs take ~15 s on the loaded CI machine


def _mnify(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script, run in ``cwd`` (the scripts write result/, logs, models there)."""
    return subprocess.run(
        [str(MNIFY), "run", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=rank_env(),
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def _verify(tmp_path: Path, n: int, script: str, *args: str, k: int | None = None) -> Any:
    summary = tmp_path / "summary.json"
    flags = ["--verify"] if k is None else ["--verify-updates", str(k)]
    began = time.monotonic()
    proc = _mnify(
        tmp_path, "-n", str(n), *flags, "--summary-json", str(summary), str(SCRIPTS / script),
        *args,
    )  # fmt: skip
    took = time.monotonic() - began
    data = json.loads(summary.read_text())
    return proc, data, took


def _checks(data: dict[str, Any]) -> list[tuple[str, list[int], str]]:
    return sorted(
        (f["check"], f["ranks"], Path(f["where"].rsplit(":", 1)[0]).name)
        for f in data["verify"]["findings"]
    )


@pytest.mark.parametrize("n", [2, 3])
def test_unscattered_dataset_shuffled_per_rank_is_same_data(tmp_path: Path, n: int) -> None:
    proc, data, took = _verify(tmp_path, n, "unscattered_shuffled.py")
    assert proc.returncode == 1, proc.stderr
    assert _checks(data) == [("same-data", list(range(n)), "unscattered_shuffled.py")]
    finding = data["verify"]["findings"][0]
    assert "6000 examples" in finding["message"]
    assert data["category"] == "stopped" and data["exit_status"] == 1
    assert data["verify"]["per_rank_batch"] == {str(r): 32 for r in range(n)}
    assert data["verify"]["global_batch"] == 32 * n
    assert took < BOUND


def test_gan_with_a_plain_discriminator_optimizer(tmp_path: Path) -> None:
    proc, data, took = _verify(tmp_path, 2, "gan_plain_discriminator.py")
    assert proc.returncode == 1, proc.stderr
    assert _checks(data) == [
        ("params-differ", [0, 1], "gan_plain_discriminator.py"),
        ("unwrapped-optimizer", [0, 1], "gan_plain_discriminator.py"),
    ]
    differ = next(f for f in data["verify"]["findings"] if f["check"] == "params-differ")
    assert "Adam on Discriminator" in differ["message"] and "/l0/W" in differ["message"]
    optimizers = {o["name"]: o["multi_node"] for o in data["verify"]["optimizers"]}
    assert optimizers == {"Adam on Discriminator": False, "Adam on Generator": True}
    assert took < BOUND


@pytest.mark.parametrize("n", [2, 3])
def test_every_rank_logging_to_one_file_is_rank_writes(tmp_path: Path, n: int) -> None:
    proc, data, took = _verify(tmp_path, n, "shared_log.py", "--log", "logs/train.log")
    assert proc.returncode == 1, proc.stderr
    findings = data["verify"]["findings"]
    named = sorted((f["check"], f["ranks"], f["where"].rsplit(":", 1)[1]) for f in findings)
    source = (SCRIPTS / "shared_log.py").read_text().splitlines()
    open_line = next(i for i, s in enumerate(source, 1) if "open(args.log" in s)
    save_line = next(i for i, s in enumerate(source, 1) if "save_npz" in s)
    others = list(range(1, n))
    assert named == [
        ("rank-writes", others, str(open_line)),
        ("rank-writes", others, str(save_line)),
    ]
    assert any("logs/train.log" in f["message"] for f in findings)
    assert any("model.npz" in f["message"] for f in findings)
    assert took < BOUND


def test_rank_0_editing_weights_alone_is_params_differ(tmp_path: Path) -> None:
    proc, data, took = _verify(tmp_path, 2, "rank0_edits_weights.py")
    assert proc.returncode == 1, proc.stderr
    assert _checks(data) == [("params-differ", [0, 1], "rank0_edits_weights.py")]
    assert "/predictor/W" in data["verify"]["findings"][0]["message"]
    assert took < BOUND


@pytest.mark.parametrize("n", [2, 3])
def test_scattered_dataset_with_a_trainer_has_no_finding(tmp_path: Path, n: int) -> None:
    """100 examples on 3 ranks: force_equal_length repeats 2, and 3 updates of 16 see them."""
    proc, data, _ = _verify(tmp_path, n, "scattered_trainer.py")
    assert proc.returncode == 0, proc.stderr
    assert data["verify"]["findings"] == []
    assert data["verify"]["updates"] == 3
    assert data["verify"]["per_rank_batch"] == {str(r): 16 for r in range(n)}
    shard = -(-100 // n)  # force_equal_length
    assert data["verify"]["iterations_per_epoch"] == {str(r): -(-shard // 16) for r in range(n)}
    assert data["category"] == "stopped" and data["stop"]["reason"] == "verify"


def test_hand_split_with_dropout_has_no_finding(tmp_path: Path) -> None:
    proc, data, _ = _verify(tmp_path, 2, "hand_split_dropout.py", k=5)
    assert proc.returncode == 0, proc.stderr
    assert data["verify"]["findings"] == []
    assert data["verify"]["updates"] == 5
    assert data["verify"]["global_batch"] == 40


def test_plain_mpiexec_with_mnify_verify_set(tmp_path: Path) -> None:
    """No launcher: rank 0 prints the verdict block itself, every rank exits 1."""
    run = run_ranks(
        2, SCRIPTS / "shared_log.py", cwd=tmp_path, env={"MNIFY_VERIFY": "2"}, check=False
    )
    assert run.returncode == 1, run.describe()
    lines = run.rank_lines(0)
    head = next(line for line in lines if line.startswith("mnify verify ("))
    assert head == "mnify verify (2 updates on 2 ranks): 2 findings"
    assert sum(line.strip().startswith("rank-writes: rank 1 at ") for line in lines) == 2
    log = (tmp_path / "train.log").read_text().splitlines()
    assert len(log) == 2 * 1  # rank 0 and rank 1 each wrote update 1 only: stopped at 2


def test_verification_off_installs_nothing(tmp_path: Path) -> None:
    """The same run without --verify: the verify package is never imported, no optimizer
    method is wrapped, no link hook is registered."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        (SCRIPTS / "hand_split_dropout.py").read_text()
        + "\nimport sys\n"
        + "from mnify.runtime import update_watch\n"
        + "print('PROBE', 'mnify.runtime.verify' in sys.modules, update_watch.is_installed(),\n"
        + "      len(chainer._get_link_hooks()), flush=True)\n",
        encoding="utf-8",
    )
    proc = _mnify(tmp_path, "-n", "2", str(probe), "--iterations", "3")
    assert proc.returncode == 0, proc.stderr
    probes = [line.split("PROBE ", 1)[1] for line in proc.stdout.splitlines() if "PROBE " in line]
    assert probes == ["False False 0", "False False 0"]


def test_channel_parallel_run_is_judged_as_model_parallel(tmp_path: Path) -> None:
    """Same data on every rank and different conv weights are by design: no finding."""
    proc, data, _ = _verify(tmp_path, 2, "channel_parallel.py")
    assert proc.returncode == 0, proc.stderr
    verify = data["verify"]
    assert verify["findings"] == []
    assert verify["model_parallel"] == [
        "a multi-node iterator sends rank 0's batches to every rank",
        "channel-parallel link /predictor/conv1",
    ]
    assert verify["per_rank_batch"] == {"0": 8, "1": 8} and verify["global_batch"] == 8


def test_ranks_that_never_reach_the_stop_end_the_job_after_verify_timeout(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    proc = _mnify(
        tmp_path, "-n", "2", "--verify", "--verify-timeout", "3",
        str(SCRIPTS / "uneven_updates.py"),
    )  # fmt: skip
    took = time.monotonic() - began
    assert proc.returncode != 0, proc.stderr
    assert "verify: rank 1 did not reach the stop after update 3 within 3 s" in proc.stderr
    assert took < BOUND + 60, f"took {took:.0f} s; the script idles 120 s"


def test_verify_timeout_and_timeline_events_need_their_feature(tmp_path: Path) -> None:
    script = str(SCRIPTS / "uneven_updates.py")
    alone = _mnify(tmp_path, "-n", "2", "--verify-timeout", "3", script)
    assert alone.returncode == 2
    assert "--verify-timeout is for --verify" in alone.stderr
    events = _mnify(tmp_path, "-n", "2", "--timeline-events", "64", script)
    assert events.returncode == 2
    assert "--timeline-events sizes the timeline: give --timeline FILE too" in events.stderr
    wired = _mnify(
        tmp_path, "-n", "2", "--dry-run", "--timeline", str(tmp_path / "t.json"),
        "--timeline-events", "64", "--verify", "--verify-timeout", "5", script,
    )  # fmt: skip
    assert wired.returncode == 0, wired.stderr
    assert '"timeline_events": 64' in wired.stdout and '"verify_timeout": 5.0' in wired.stdout
