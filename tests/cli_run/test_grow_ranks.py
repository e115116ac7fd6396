"""``mnify run --grow-ranks``: a job relaunched with more ranks at its milestones, resuming each
phase from the global snapshot the previous one wrote, trains exactly like one process.

The script (tests/cli_run/scripts/grow_ranks/train.py) is written once for the global batch and
never changes; it doubles its batch every epoch (GrowBatch). One job runs 1 -> 2 -> 3 ranks,
another the same training on one process; their parameters agree, every example is read once
per epoch across the phases, and the code after ``trainer.run()`` runs only in the last phase.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mnify.launch import batch_phases, grow_ranks
from tests.cli_run.console import mnify_run

SCRIPT = Path(__file__).parent / "scripts" / "grow_ranks" / "train.py"


def _ledger(out: Path) -> dict[int, dict[str, list[int]]]:
    """Iteration -> {ledger file: examples read}."""
    read: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(out.glob("ledger.*.txt")):
        for line in path.read_text().splitlines():
            iteration, example = map(int, line.split())
            read[iteration][path.name].append(example)
    return read


@pytest.mark.mpi
def test_growing_ranks_trains_like_one_process(tmp_path: Path) -> None:
    one, grown = tmp_path / "one", tmp_path / "grown"
    one.mkdir()
    grown.mkdir()
    plain = mnify_run("-n", "1", str(SCRIPT), str(one), "--grow", timeout=240)
    assert plain.returncode == 0, plain.stderr
    summary = tmp_path / "summary.json"
    proc = mnify_run(
        "-n", "1", "--grow-ranks", "2@1e,3@2e", "--summary-json", str(summary),
        str(SCRIPT), str(grown), "--grow", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    phases = json.loads(summary.read_text())["phases"]
    assert [(p["ranks"], p["stop"], p["exit_status"]) for p in phases] == [
        (1, "1e", 0),
        (2, "2e", 0),
        (3, None, 0),
    ]
    # 24 examples: 6 steps of 4, then 3 of 8 (grown at epoch 1), then 16
    assert [(p["stopped_at_iteration"], p["global_batch"]) for p in phases[:2]] == [(6, 8), (9, 16)]
    assert "mnify run: phase 3: 3 ranks, ran to the end" in proc.stderr
    # the phases' snapshots are removed once the last phase ended well
    assert all(p["snapshot"] is None for p in phases)
    assert not any(Path(".").glob("mnify-phases-*"))
    # the script's own per-epoch extension fired at the same iterations, once each
    epoch_ends = [line for line in proc.stdout.splitlines() if "EPOCH END" in line]
    assert epoch_ends == [line for line in plain.stdout.splitlines() if "EPOCH END" in line]
    assert [line.split("=")[-1] for line in epoch_ends] == ["6", "9", "11"]
    # the code after trainer.run() ran once per rank of the last phase only
    assert proc.stdout.count("AFTER RUN") == 3 and proc.stdout.count("size=3") == 3
    a, b = np.load(one / "params.npz"), np.load(grown / "params.npz")
    for name in a.files:
        assert np.max(np.abs(a[name] - b[name])) <= 1e-10 * np.max(np.abs(a[name])), name
    # every iteration was read by one phase only; the first two epochs read every example twice
    read = _ledger(grown)
    assert sorted(read) == list(range(1, 12))
    for iteration, files in read.items():
        assert len({name.split(".")[1] for name in files}) == 1, (iteration, files)
    first_two_epochs = Counter(e for i in range(1, 10) for ex in read[i].values() for e in ex)
    assert first_two_epochs == Counter({e: 2 for e in range(24)})
    # and the same iterations, examples and order as the uninterrupted run
    plain_read = _ledger(one)
    for i in range(1, 12):
        merged = [e for name in sorted(read[i]) for e in read[i][name]]
        assert merged == plain_read[i]["ledger.1.0.txt"], i


def test_usage_errors_start_nothing(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    for args, message in [
        (("--grow-ranks", "2@1e"), "does not grow the ranks"),
        (("--grow-ranks", "4@x"), "is not a milestone"),
        (("--grow-ranks", "4@2e,8@1e"), "milestones must increase"),
        (("--grow-ranks", "4@1e", "--hostfile", str(hostfile)), "hosts offer 2 slots"),
        (("--grow-ranks", "4@1e", "--verify"), "--grow-ranks runs several jobs"),
    ]:
        proc = mnify_run("-n", "2", *args, str(SCRIPT), str(tmp_path), timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert not list(tmp_path.glob("ledger*"))  # the script never started


def test_phases_resume_from_the_previous_snapshot() -> None:
    growths = grow_ranks.parse("4@30e, 8@60e", 2)
    phases = grow_ranks.plan(2, growths, "/d")
    assert [(p.ranks, str(p.stop) if p.stop else None) for p in phases] == [
        (2, "30e"),
        (4, "60e"),
        (8, None),
    ]
    assert [p.resume for p in phases] == [None, "/d/phase0.npz", "/d/phase1.npz"]
    assert [p.snapshot for p in phases] == ["/d/phase0.npz", "/d/phase1.npz", None]
    assert grow_ranks.parse("3@500i", 1)[0].milestone.unit == "i"


@pytest.mark.mpi
def test_the_timeline_shows_each_steps_batch_and_counts_halved_all_reduces(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.json"
    proc = mnify_run(
        "-n", "2", "--timeline", str(trace), str(SCRIPT), str(tmp_path), "--grow",
        "--max-per-rank", "2", timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(trace.read_text())
    assert [
        (p.first_step, p.last_step, p.global_batch, p.ranks, p.micro_batches, p.shares)
        for p in batch_phases.phases(data)
    ] == [(0, 5, 4, 2, 1, (2, 2)), (6, 8, 8, 2, 2, (4, 4)), (9, 10, 16, 2, 4, (8, 8))]
    assert (
        "mnify run: timeline: steps 6-8: global batch 8 on 2 ranks (shares 4/4 at the last "
        "step), 2 micro-batches a step"
    ) in proc.stderr
    # counted, not timed: one gradient all-reduce a step, so epoch 1 (batch 8) has half of
    # epoch 0's (batch 4) although it computes twice as much per step in micro-batches
    mean_grads: Counter[int] = Counter(
        ev["args"]["step"]
        for ev in data["traceEvents"]
        if ev["ph"] == "X"
        and ev["cat"] == "collective"
        and ev["name"] == "multi_node_mean_grad"
        and ev["pid"] == 0
    )
    assert sum(mean_grads[s] for s in range(0, 6)) == 6
    assert sum(mean_grads[s] for s in range(6, 9)) == 3


def test_batch_phases_group_steps_and_show_the_last_shares() -> None:
    def update(rank: int, step: int, batch: int, share: int, micro: int = 1) -> dict[str, Any]:
        args = {"step": step, "global_batch": batch, "share": share}
        if micro > 1:
            args["micro_batches"] = micro
        return {"ph": "X", "cat": "update", "pid": rank, "args": args}

    events = [update(0, 0, 6, 3), update(1, 0, 6, 3), update(0, 1, 6, 4), update(1, 1, 6, 2)]
    events += [update(0, 2, 12, 8, 2), update(1, 2, 12, 4, 2)]
    events.append({"ph": "X", "cat": "update", "pid": 0, "args": {"step": 3}})  # no global batch
    found = batch_phases.phases({"traceEvents": events})
    assert [(p.first_step, p.last_step, p.shares) for p in found] == [
        (0, 1, (4, 2)),
        (2, 2, (8, 4)),
    ]
    assert batch_phases.render(found, "x:") == [
        "x: steps 0-1: global batch 6 on 2 ranks (shares 4/2 at the last step)",
        "x: step 2: global batch 12 on 2 ranks (shares 8/4), 2 micro-batches a step",
    ]


@pytest.mark.mpi
def test_verify_sees_a_global_batch_run_as_split(tmp_path: Path) -> None:
    """Every rank holds the whole dataset by design; --verify compares what each rank drew."""
    summary = tmp_path / "summary.json"
    proc = mnify_run(
        "-n", "2", "--verify", "--summary-json", str(summary), str(SCRIPT), str(tmp_path),
        "--epochs", "20", timeout=240,
    )  # fmt: skip
    kinds = {f["check"] for f in json.loads(summary.read_text())["verify"]["findings"]}
    assert "same-data" not in kinds and "params-differ" not in kinds, proc.stderr


def test_scale_reports_the_measured_steps_batch() -> None:
    from mnify.launch.scale import measured_phases

    def update(step: int, batch: int) -> dict[str, Any]:
        return {
            "ph": "X",
            "cat": "update",
            "pid": 0,
            "args": {"step": step, "global_batch": batch, "share": batch},
        }

    trace = {"traceEvents": [update(s, 4 if s < 6 else 8) for s in range(12)]}
    assert [(p.first_step, p.last_step, p.global_batch) for p in measured_phases(trace, 2, 6)] == [
        (2, 5, 4),
        (6, 7, 8),
    ]
