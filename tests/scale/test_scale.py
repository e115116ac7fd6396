"""``mnify scale`` on scripts whose costs are known (compute modelled by sleeping in forward,
so speed-up bounds hold on a loaded machine): the speed-up, the JSON, and each named cause."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mnify import environment
from mnify.environment import LaunchWiring
from mnify.runtime import scale_probe
from tests.cli_run.console import MNIFY, rank_env

SLEEPY = Path(__file__).parent / "scripts" / "sleepy.py"
PARTS = {"compute", "mean_grad", "wait", "data", "rank0_only"}


def mnify_scale(
    tmp_path: Path, counts: str, *script_args: str, updates: int = 6, warmup: int = 2,
    extra: tuple[str, ...] = (), timeout: float = 400,
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:  # fmt: skip
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [str(MNIFY), "scale", "-n", counts, "--updates", str(updates), "--warmup-updates",
         str(warmup), "--json", str(out), *extra, str(SLEEPY), *script_args],
        capture_output=True, text=True, timeout=timeout, env=rank_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert isinstance(data, dict)
    return data, proc


def kinds(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in data["causes"]}


def test_a_healthy_script_scales_and_gets_no_cause(tmp_path: Path) -> None:
    plot = tmp_path / "scale.png"
    data, proc = mnify_scale(tmp_path, "1,2", "--compute-ms", "200", extra=("--plot", str(plot)))
    assert set(data) == {"schema", "runs", "speedup", "efficiency", "causes"}
    assert data["schema"] == 1 and [r["ranks"] for r in data["runs"]] == [1, 2]
    for run in data["runs"]:
        assert set(run) == {"ranks", "update_ms", "update_ms_spread", "examples_per_s",
                            "breakdown_ms", "batch_phases"}  # fmt: skip
        assert run["batch_phases"] == []  # no global-batch iterator in this script
        assert set(run["breakdown_ms"]) == PARTS
        assert run["update_ms"] >= 200.0  # the sleep is in every step
        assert run["breakdown_ms"]["compute"] >= 190.0
    one, two = data["runs"]
    assert two["examples_per_s"] / one["examples_per_s"] == pytest.approx(data["speedup"], 1e-3)
    assert data["speedup"] >= 1.5 and data["efficiency"] == pytest.approx(
        data["speedup"] / 2, abs=1e-3
    )
    assert data["causes"] == [], proc.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rank0_guarded_work_every_iteration_is_rank0_work(tmp_path: Path) -> None:
    data, proc = mnify_scale(tmp_path, "2", "--compute-ms", "50", "--rank0-ms", "150")
    found = kinds(data)
    assert found["rank0-work"]["ranks"] == [0] and found["rank0-work"]["share"] >= 0.15
    assert "straggler" not in found, proc.stdout  # rank 0 is late because of it: not twice
    (run,) = data["runs"]
    assert run["breakdown_ms"]["rank0_only"] >= 150.0 / 2 * 0.9  # mean over the two ranks


def test_an_extension_only_rank0_runs_is_rank0_work(tmp_path: Path) -> None:
    data, proc = mnify_scale(tmp_path, "2", "--trainer", "--compute-ms", "50", "--rank0-ms", "150")
    assert kinds(data)["rank0-work"]["ranks"] == [0], proc.stdout


def test_one_slower_rank_is_the_straggler(tmp_path: Path) -> None:
    data, proc = mnify_scale(
        tmp_path, "2", "--compute-ms", "50", "--slow-rank", "1", "--slow-ms", "150"
    )
    found = kinds(data)
    assert found["straggler"]["ranks"] == [1] and found["straggler"]["share"] >= 0.15
    assert "rank0-work" not in found, proc.stdout


def test_the_issue_straggler_sleeping_1_5_s_and_0_3_s_is_named(tmp_path: Path) -> None:
    data, proc = mnify_scale(
        tmp_path, "2", "--trainer", "--slow-rank", "1", "--slow-ms", "1500",
        "--slow-extra-ms", "300", updates=4, warmup=1,
    )  # fmt: skip
    straggler = kinds(data)["straggler"]
    assert straggler["ranks"] == [1] and straggler["share"] >= 0.5, proc.stdout


def test_a_wide_model_with_little_compute_is_communication_bound(tmp_path: Path) -> None:
    data, proc = mnify_scale(tmp_path, "2", "--wide", "1500")
    cause = kinds(data)["communication-bound"]
    assert cause["ranks"] == [0, 1] and cause["share"] >= 0.15
    assert "9.0 MB" in cause["message"], cause  # 1500 x 1500 + ... float32 weights


def test_slow_example_loading_is_data_loading(tmp_path: Path) -> None:
    data, proc = mnify_scale(tmp_path, "2", "--compute-ms", "20", "--load-ms", "10")
    cause = kinds(data)["data-loading"]
    assert cause["ranks"] == [0, 1] and cause["share"] >= 0.15, proc.stdout
    assert "MultiprocessIterator" in cause["message"]


def test_an_unsplit_dataset_is_not_split(tmp_path: Path) -> None:
    data, _ = mnify_scale(tmp_path, "2", "--compute-ms", "50", "--unsplit")
    assert kinds(data)["not-split"]["ranks"] == [0, 1]


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        ("comm.rank == 0", True),
        ("0 == self.comm.rank", True),
        ("rank == 0 and verbose", True),
        ("comm.intra_rank == 0", True),
        ("comm.rank != 0", False),
        ("comm.rank > 0", False),
        ("comm.rank", False),
        ("comm.size == 0", None),
        ("x == 0", None),
    ],
)
def test_which_branch_is_rank0_only(test: str, expected: bool | None) -> None:
    node = ast.parse(test, mode="eval").body
    assert scale_probe._is_rank_zero_test(node) is expected


def test_without_scale_nothing_is_installed_and_with_it_the_run_stops(tmp_path: Path) -> None:
    """A fresh process under the bootstrap: no probe, no wrapped class, the script as written;
    told scale_updates=3 (in MNIFY_LAUNCH, as mnify scale tells it) the probes are in and every
    update after the third is never made."""
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent('''
        import sys
        import chainer, chainer.training
        from mnify.runtime import update_watch
        from chainer.iterators import SerialIterator
        watched = [getattr(SerialIterator.__next__, "_mnify_scale", False),
                   getattr(chainer.training.Trainer.extend, "_mnify_scale", False),
                   update_watch.is_installed(), "mnify.runtime.scale_probe" in sys.modules]
        print("PROBES", watched, flush=True)
        opt = chainer.optimizers.SGD()
        opt.setup(chainer.links.Linear(2, 2))
        for i in range(10):
            opt.update()
            print("UPDATE", i + 1, flush=True)
    '''))  # fmt: skip
    run = [sys.executable, "-m", "mnify.launch.bootstrap", str(script)]
    off = subprocess.run(run, capture_output=True, text=True, timeout=120, env=rank_env())
    assert off.returncode == 0, off.stderr
    assert "PROBES [False, False, False, False]" in off.stdout and "UPDATE 10" in off.stdout
    told = {environment.LAUNCH.name: LaunchWiring(scale_updates=3).to_text()}
    on = subprocess.run(run, capture_output=True, text=True, timeout=120, env=rank_env(**told))
    assert on.returncode == 0, on.stderr
    assert "PROBES [True, True, True, True]" in on.stdout
    assert [ln for ln in on.stdout.splitlines() if ln.startswith("UPDATE")][-1] == "UPDATE 2"
    assert "stopped after update 3" in on.stderr


def _run(ranks: int, compute: float, *, batch: float = 8.0, on_gpu: bool = False) -> Any:
    from mnify.launch.attribution import Attribution, Breakdown
    from mnify.launch.scale import Run

    per_rank = {r: Breakdown(compute=compute, mean_grad=1.0) for r in range(ranks)}
    found = Attribution(
        steps=[1, 2, 3], step_ms=[compute + 1.0] * 3, per_rank=per_rank,
        examples_per_step=batch * ranks, batch_per_rank=dict.fromkeys(range(ranks), batch),
        on_gpu=on_gpu,
    )  # fmt: skip
    return Run(ranks, compute + 1.0, 0.0, batch * ranks, found, (0.0, 0.0, 0.0))


def test_compute_that_grows_with_the_count_is_noted_not_named() -> None:
    from mnify.launch.scale import causes, render

    runs = [_run(1, 100.0), _run(2, 250.0)]
    assert causes(runs) == []
    notes = [ln for ln in render(runs, [], 1, 3) if "compute per update grew" in ln]
    assert len(notes) == 1 and "2.50x from 1 to 2 ranks" in notes[0]
    assert not [ln for ln in render([_run(1, 100), _run(2, 110)], [], 1, 3) if "grew" in ln]


def test_a_small_per_rank_batch_on_a_gpu_is_small_batch() -> None:
    from mnify.launch.scale import causes

    (cause,) = causes([_run(1, 10.0, on_gpu=True), _run(2, 10.0, on_gpu=True)])
    assert cause.kind == "small-batch" and cause.ranks == [0, 1]
    assert causes([_run(2, 10.0, batch=64, on_gpu=True)]) == []
    assert causes([_run(2, 10.0)]) == []  # on the CPU the batch size is not judged
