"""End to end: ``mnify convert --model-parallel channel`` on the CNN fixture, trained 2 epochs
under mpiexec, reproduces the single-process run of the original script (its LogReport)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mpirun import REPO, mpi_env, run_ranks

FIXTURE = REPO / "fixtures" / "convert" / "model_parallel_cnn.in.py"
KEYS = ["main/loss", "main/accuracy", "validation/main/loss", "validation/main/accuracy"]


def convert(tmp_path: Path, source: Path = FIXTURE) -> Path:
    out = tmp_path / "train_mn.py"
    mnify = Path(sys.executable).parent / "mnify"
    cmd = [str(mnify), "convert", "--model-parallel", "channel", str(source), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text(encoding="utf-8")
    # the conversion must actually split convolutions and feed every rank the same batches
    assert "create_channel_parallel_model" in text and "create_multi_node_iterator" in text, text
    return out


def log_of(directory: Path) -> list[dict[str, float]]:
    entries: list[dict[str, float]] = json.loads((directory / "log").read_text(encoding="utf-8"))
    return entries


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_converted_cnn_trains_like_the_original(tmp_path: Path, n: int) -> None:
    converted = convert(tmp_path)
    single = subprocess.run(
        [sys.executable, str(FIXTURE), "--epoch", "2", "--out", "single"],
        cwd=tmp_path,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stdout + single.stderr
    # On 3 ranks MNIFY_DEBUG=1 also checks, layer by layer, that the replicas stay identical.
    env = {"MNIFY_DEBUG": "1" if n == 3 else "0", "MNIFY_WATCHDOG_TIMEOUT": "120"}
    args = ["--epoch", "2", "--out", "parallel"]
    run_ranks(n, converted, args, cwd=tmp_path, env=env, timeout=300)

    want, got = log_of(tmp_path / "single"), log_of(tmp_path / "parallel")
    assert [e["epoch"] for e in got] == [e["epoch"] for e in want] == [1, 2]
    for w, g in zip(want, got, strict=True):
        for key in KEYS:
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), (key, w, g)


@pytest.mark.mpi
def test_unseeded_script_still_builds_identical_replicas(tmp_path: Path) -> None:
    """A script that never seeds numpy still trains: the converter hands rank 0's random state
    to every rank, so replicated layers and weight slices start the same (MNIFY_DEBUG checks)."""
    unseeded = tmp_path / "unseeded.py"
    source = FIXTURE.read_text(encoding="utf-8")
    assert "    np.random.seed(0)\n" in source
    unseeded.write_text(source.replace("    np.random.seed(0)\n", ""), encoding="utf-8")
    converted = convert(tmp_path, unseeded)
    env = {"MNIFY_DEBUG": "1", "MNIFY_WATCHDOG_TIMEOUT": "120"}
    run_ranks(2, converted, ["--epoch", "1", "--out", "parallel"], cwd=tmp_path, env=env)
