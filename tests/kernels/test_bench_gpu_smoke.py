"""bench/gpu.py runs end to end (``--smoke``) on the CuPy stand-in, so a GPU session does not
spend its few minutes on a typo. Its numbers are meaningless here; only the code paths run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import fakecupy

REPO = Path(__file__).resolve().parents[2]
FAKE = fakecupy.PATH

DRIVER = """
import runpy, sys
sys.path.insert(0, {fake!r})
sys.path.insert(0, {repo!r})
import mnify_fake_device  # the CUDA kernels -> their numpy twins
sys.argv = ["bench/gpu.py", "--smoke", "--json", {out!r}]
runpy.run_path({bench!r}, run_name="__main__")
"""


def test_bench_gpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = DRIVER.format(
        fake=str(FAKE), repo=str(REPO), out=str(out), bench=str(REPO / "bench" / "gpu.py")
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["smoke"] is True
    assert report["pack"]["arrays"] == 161 and report["pack"]["params"] == 25_557_032
    assert set(report["pack"]) >= {"float32->float32", "float32->float16"}
    assert len(report["bn"]) == 18 and all(r["max_rel_err"] < 1e-5 for r in report["bn"])
    assert len(report["gather"]) == 2
    assert "goal >= 0.80" in proc.stdout
    for key in ("float32->float32", "float32->float16"):
        timed = report["pack"][key]
        assert timed["kernel_s"] > 0 and timed["host_s"] > 0 and timed["call_s"] > 0
    # the one-rank pure_nccl mean against a raw all-reduce (NCCL stood in by MPI)
    assert report["nccl"]["ranks"] == 1 and report["nccl"]["ratio_vs_raw"] > 0
    assert "pure_nccl mean of the same gradients" in proc.stdout
