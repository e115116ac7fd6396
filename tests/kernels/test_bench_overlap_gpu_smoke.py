"""bench/overlap_gpu.py runs end to end (``--smoke``) on the CuPy stand-in, so a GPU session does
not spend its minutes on a typo: the overlap scheduler's NCCL reducer (side stream, events,
pack, all-reduce, unpack) runs its code paths. The numbers are meaningless here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import fakecupy

REPO = Path(__file__).resolve().parents[2]


def test_bench_overlap_gpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "overlap.json"
    proc = fakecupy.run_bench_smoke(REPO / "bench" / "overlap_gpu.py", out, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["arrays"] == 161
    assert set(report["seconds"]) == {"backward", "reduce", "sequential", "overlap"}
    assert report["buckets"] >= 1 and report["buckets_started_during_backward"] > 0
    assert "hidden fraction of the mean behind backward" in proc.stdout
