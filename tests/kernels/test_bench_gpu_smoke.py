"""bench/gpu.py runs end to end (``--smoke``) on the CuPy stand-in, so a GPU session does not
spend its few minutes on a typo. Its numbers are meaningless here; only the code paths run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parent / "fakecupy"

DRIVER = """
import runpy, sys, types
sys.path.insert(0, {fake!r})
sys.path.insert(0, {repo!r})
from mnify.runtime.kernels import host
shim = types.ModuleType("mnify.runtime.kernels.device")
for name in ("pack", "unpack", "channel_sums", "bn_backward_sums", "gather_channels", "split_channels"):
    setattr(shim, name, getattr(host, name))
sys.modules["mnify.runtime.kernels.device"] = shim
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
