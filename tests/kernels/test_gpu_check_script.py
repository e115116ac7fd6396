"""scripts/gpu_check.sh's preconditions and raw NCCL steps run on the CuPy stand-in, under
CuPy 14's and CuPy 13's unique-id forms, so a GPU session does not spend its minutes on a
mistake in the script itself (its test step is covered by test_gpu_tests_on_stand_in.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import fakecupy
from tests.support.mpirun import REPO, mpi_env

FAKE = fakecupy.PATH


@pytest.mark.parametrize(("cupy", "id_type"), [("14.2.0", "bytes"), ("13.6.0", "tuple")])
def test_gpu_check_steps_1_to_3_on_the_stand_in(cupy: str, id_type: str, tmp_path: Path) -> None:
    env = mpi_env(
        {
            "PYTHONPATH": f"{FAKE}:{REPO}",
            "PYTHON": sys.executable,
            "OUT": str(tmp_path),
            "GPU_CHECK_STEPS": "1 2 3",
            "FAKE_CUPY_VERSION": cupy,
        }
    )
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert f"type(nccl.get_unique_id()): {id_type}" in output, output
    assert "PRECONDITIONS OK" in output and "NCCL RAW OK" in output, output
    assert "FAIL" not in output.replace("FAILED", ""), output
    summary = (tmp_path / "summary.txt").read_text()
    assert "preconditions: exit 0" in summary and "raw NCCL: exit 0" in summary, summary


def _gpu_check(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = mpi_env({"PYTHON": sys.executable, "OUT": str(tmp_path), **env})
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_plans_every_step_within_the_cap(tmp_path: Path) -> None:
    proc = _gpu_check(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [s["step"] for s in plan["steps"]] == [1, 2, 3, 4, 5, 6]
    total = sum(s["budget_s"] for s in plan["steps"])
    assert plan["total_s"] == total and plan["fits"] is True
    assert total + plan["reserve_s"] <= plan["cap_s"] <= 540
    assert "DRY RUN OK" in proc.stdout and "--timeout-method thread" in proc.stdout
    assert not (tmp_path / "summary.txt").exists()  # nothing ran


def test_dry_run_refuses_budgets_over_the_cap(tmp_path: Path) -> None:
    proc = _gpu_check(tmp_path, "--dry-run", GPU_CHECK_BUDGET_S="300")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["fits"] is False


def test_a_failing_step_still_writes_the_final_summary(tmp_path: Path) -> None:
    # no stand-in on the path and no GPU here: CuPy is missing, the preconditions fail
    proc = _gpu_check(tmp_path, GPU_CHECK_STEPS="2 3", PYTHONPATH=str(REPO))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    steps = {ln.split(":")[0]: ln.split(": ", 1)[1] for ln in lines if ln.startswith("step ")}
    assert (
        steps["step 2 preconditions"].startswith("exit ")
        and steps["step 2 preconditions"] != "exit 0"
    )
    assert steps["step 3 raw one-rank NCCL calls"] != "exit 0"
    assert any(
        ln.startswith("verified here only at comm.size == 1; UNVERIFIED: multi-rank NCCL")
        for ln in lines
    )
    assert lines[-1] == "RESULT: FAILED"
