"""scripts/gpu_check.sh's preconditions and raw NCCL steps run on the CuPy stand-in, under
CuPy 14's and CuPy 13's unique-id forms, so a GPU session does not spend its minutes on a
mistake in the script itself (its test step is covered by test_gpu_tests_on_stand_in.py)."""

from __future__ import annotations

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
