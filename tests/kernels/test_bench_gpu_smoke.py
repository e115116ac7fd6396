"""bench/gpu.py runs end to end (``--smoke``) on the CuPy stand-in, so a GPU session does not
spend its few minutes on a typo. Its numbers are meaningless here; only the code paths run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import fakecupy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_gpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = fakecupy.run_bench_smoke(REPO / "bench" / "gpu.py", out, tmp_path, timeout=300)
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
