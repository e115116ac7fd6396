"""End to end: ``mnify convert --model-parallel spatial`` on a fully convolutional classifier
(float64, BatchNormalization, stride 2, dilation, pooling), trained under mpiexec on 2 ranks,
ends at the parameters of the original script's single-process run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import libcst as cst
import numpy as np
import pytest

from tests.support.mpirun import REPO, mpi_env, run_ranks

FIXTURE = REPO / "fixtures" / "convert" / "spatial_parallel_cnn.in.py"


def _called_names(tree: cst.Module) -> set[str]:
    names: set[str] = set()

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            names.add(cst.Module([]).code_for_node(node.func))

    tree.visit(Calls())
    return names


def convert(tmp_path: Path) -> tuple[Path, list[dict[str, object]]]:
    out, report = tmp_path / "train_mn.py", tmp_path / "report.json"
    mnify = Path(sys.executable).parent / "mnify"
    cmd = [str(mnify), "convert", "--model-parallel", "spatial", str(FIXTURE), "-o", str(out)]
    done = subprocess.run(
        cmd + ["--report", str(report)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    called = _called_names(cst.parse_module(out.read_text(encoding="utf-8")))
    # the model is wrapped where it is built, iterators feed every rank the same batches, the
    # dataset is not scattered and the optimizer is not wrapped (gradients are whole already)
    assert "mn.links.create_spatial_parallel_model" in called, called
    assert "mn.create_multi_node_iterator" in called, called
    assert "mn.scatter_dataset" not in called and "mn.create_multi_node_optimizer" not in called
    entries = json.loads(report.read_text(encoding="utf-8"))
    entries = entries["entries"] if isinstance(entries, dict) else entries
    return out, entries


def test_report_states_memory_per_rank(tmp_path: Path) -> None:
    _, entries = convert(tmp_path)
    notes = [e for e in entries if e.get("step") == "model-parallel"]
    memory = [e for e in notes if str(e.get("message", "")).startswith("memory per rank")]
    assert len(memory) == 1, notes
    assert "1/comm.size" in str(memory[0]["message"])


@pytest.mark.mpi
def test_converted_spatial_script_trains_to_the_original_parameters(tmp_path: Path) -> None:
    converted, _ = convert(tmp_path)
    args = ["--epoch", "2", "--synthetic", "24"]
    single = subprocess.run(
        [sys.executable, str(FIXTURE), *args, "--out", "single"],
        cwd=tmp_path,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stdout + single.stderr
    env = {"MNIFY_WATCHDOG_TIMEOUT": "120"}
    run_ranks(2, converted, [*args, "--out", "parallel"], cwd=tmp_path, env=env, timeout=400)

    want = np.load(tmp_path / "single" / "model.npz")
    got = np.load(tmp_path / "parallel" / "model.npz")
    assert sorted(got.keys()) == sorted(want.keys())
    assert want["predictor/fc/W"].dtype == np.float64
    scale = max(float(np.max(np.abs(want[k]))) for k in want.keys())
    for key in want.keys():
        err = float(np.max(np.abs(got[key] - want[key]), initial=0.0))
        assert err <= 1e-10 * scale, (key, err)
    # and the logged losses/accuracies agree (training and validation)
    log_single = json.loads((tmp_path / "single" / "log").read_text(encoding="utf-8"))
    log_parallel = json.loads((tmp_path / "parallel" / "log").read_text(encoding="utf-8"))
    for w, g in zip(log_single, log_parallel, strict=True):
        for key in ("main/loss", "main/accuracy", "validation/main/loss"):
            assert g[key] == pytest.approx(w[key], rel=1e-10), (key, w, g)
