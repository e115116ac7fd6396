"""scripts/gpu_check.sh's step 6 (bench/overlap_gpu.py) runs on the CuPy stand-in, so a GPU
session does not spend its minutes on a mistake in the step itself. The CUDA kernels are
swapped for their numpy twins by a ``sitecustomize`` that imports ``mnify_fake_device``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import fakecupy
from tests.support.mpirun import REPO, mpi_env


def test_gpu_check_step_6_on_the_stand_in(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import mnify_fake_device  # noqa: F401\n")
    out = tmp_path / "out"
    env = mpi_env(
        {
            "PYTHONPATH": f"{site}:{fakecupy.PATH}:{REPO}",
            "PYTHON": sys.executable,
            "OUT": str(out),
            "GPU_CHECK_STEPS": "6",
            "MNIFY_OVERLAP_BENCH_ARGS": "--smoke",
        }
    )
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    summary = (out / "summary.txt").read_text()
    assert "overlap bench: exit 0" in summary and "hidden fraction" in summary, summary
    report = json.loads((out / "bench_overlap_gpu.json").read_text())
    assert report["arrays"] == 161 and report["smoke"] is True
