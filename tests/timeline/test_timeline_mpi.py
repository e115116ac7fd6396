"""Real ranks recording under plain mpiexec (``MNIFY_TIMELINE=DIR``), merged by ``mnify timeline
--merge``: clock skew removed, every collective and bucket recorded alike on every rank,
missing ranks named, and nothing recorded unless every rank records."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from mnify.launch import stragglers, timeline_merge
from tests.support.mpirun import RankRun, run_ranks
from tests.support.rank_checks import missing

pytestmark = pytest.mark.mpi

SCRIPTS = Path(__file__).parent / "scripts"
MNIFY = Path(sys.executable).parent / "mnify"
QUIET = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def mnify_timeline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MNIFY), "timeline", *args], capture_output=True, text=True, timeout=120
    )


def assert_passed(run: RankRun, n: int, name: str) -> None:
    """Every rank of ``run`` reported ``name`` passed (tests/support/rank_checks)."""
    for r in range(n):
        assert not missing(run.rank_lines(r), [name]), f"rank {r}\n{run.describe()}"


def x_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_skewed_clocks_are_aligned_and_missing_ranks_named(tmp_path: Path) -> None:
    ranks_dir = tmp_path / "ranks"
    skew_ms = 250.0
    run = run_ranks(
        3,
        SCRIPTS / "train.py",
        ["--steps", "25", "--skew-ms", str(skew_ms)],
        env={**QUIET, "MNIFY_TIMELINE": str(ranks_dir)},
        timeout=240,
    )
    assert run.output.count("DONE") == 3
    out = tmp_path / "trace.json"
    merged = mnify_timeline("--merge", str(ranks_dir), "-o", str(out))
    assert merged.returncode == 0, merged.stderr
    trace = json.loads(out.read_text())
    assert timeline_merge.validate(trace) == []
    assert {e["pid"] for e in x_events(trace)} == {0, 1, 2}
    injected = {r: r * skew_ms * (-1 if r % 2 else 1) for r in range(3)}  # train.py's skew
    offsets = trace["otherData"]["mnify"]["clock_offsets_ms"]
    for r in range(3):
        assert abs(offsets[str(r)] - injected[r]) < 1.0, (offsets, injected)
    # after the merge, every rank leaves a collective at about the same time (before it, the
    # skews put them 250 and 500 ms apart)
    groups = stragglers.collectives(trace)
    assert len(groups) >= 25
    leaves: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in x_events(trace):
        if e["cat"] == "collective":
            leaves[(e["args"]["comm"], e["args"]["seq"])].append(e["ts"] + e["dur"])
    spread_ms = sorted((max(v) - min(v)) / 1e3 for v in leaves.values())
    assert spread_ms[len(spread_ms) // 2] < 50.0, spread_ms
    cats = {e["cat"] for e in x_events(trace)}
    assert {"collective", "bucket", "pack", "unpack", "update", "optimizer"} <= cats
    steps = {e["args"]["step"] for e in x_events(trace) if e["cat"] == "update"}
    assert steps == set(range(25))
    assert not ranks_dir.joinpath("rank-1.timeline").stat().st_size % 8

    # a rank whose file did not reach this directory is named, with its host
    ranks_dir.joinpath("rank-1.timeline").unlink()
    missing = mnify_timeline("--merge", str(ranks_dir), "-o", str(tmp_path / "t2.json"))
    assert missing.returncode == 2 and not (tmp_path / "t2.json").exists()
    assert "no timeline from rank 1 of 3" in missing.stderr
    partial = mnify_timeline("--merge", str(ranks_dir), "-o", str(tmp_path / "t3.json"), "--allow-missing")  # fmt: skip
    assert partial.returncode == 0, partial.stderr
    assert json.loads((tmp_path / "t3.json").read_text())["otherData"]["mnify"][
        "missing_ranks"
    ] == [1]


@pytest.mark.parametrize(
    ("communicator", "shared_memory"), [("flat", "0"), ("flat", "1"), ("naive", "1")]
)
def test_every_collective_recorded_alike_on_every_rank(
    tmp_path: Path, communicator: str, shared_memory: str
) -> None:
    ranks_dir = tmp_path / "ranks"
    run = run_ranks(
        2,
        SCRIPTS / "collectives.py",
        [communicator],
        env={**QUIET, "MNIFY_TIMELINE": str(ranks_dir), "MNIFY_SHARED_MEMORY": shared_memory},
        timeout=180,
    )
    assert run.output.count("WRAPPED True") == 2
    assert_passed(run, 2, "collectives")
    merged = timeline_merge.merge_directory(ranks_dir)
    trace = merged.trace
    assert timeline_merge.validate(trace) == [] and merged.ranks == [0, 1]
    events = x_events(trace)
    by_rank: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for e in events:
        if e["cat"] == "collective":
            by_rank[e["pid"]].append((e["name"], e["args"]["comm"], e["args"]["seq"]))
    assert by_rank[0] == by_rank[1]
    names = [name for name, _, _ in by_rank[0]]
    assert names == [
        "bcast_data", "multi_node_mean_grad", "multi_node_mean_grad", "multi_node_mean_grad",
        "allreduce", "bcast", "allgather", "gather_obj", "alltoall", "scatter", "split",
        "allreduce_obj", "barrier", "barrier",
    ]  # fmt: skip
    comms = [comm for _, comm, _ in by_rank[0]]
    assert comms[-3] == comms[-2] != comms[0] == comms[-1]  # the split's collectives apart
    assert len(stragglers.collectives(trace)) == len(names)  # each one complete
    p2p = sorted((e["name"], e["pid"], e["args"]["peer"], e["args"].get("bytes")) for e in events if e["cat"] == "p2p")  # fmt: skip
    assert p2p == [("recv", 1, 0, 8000), ("send", 0, 1, 8000)]
    grads = [e for e in events if e["name"] == "multi_node_mean_grad"]
    assert all(e["args"]["bytes"] == 4 * (7 + 300 + 40 + 600_000) for e in grads)
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        for grad in (e for e in mine if e["name"] == "multi_node_mean_grad"):
            inside = [
                e for e in mine
                if e["cat"] in ("bucket", "pack", "unpack") and e["args"]["seq"] == grad["args"]["seq"]
                and e["args"]["comm"] == grad["args"]["comm"]
            ]  # fmt: skip
            kinds = {e["cat"] for e in inside}
            if communicator == "naive":
                assert kinds == {"bucket"}  # one allreduce per gradient, no packing
            elif shared_memory == "0":
                assert {"bucket", "pack"} <= kinds
            else:  # the segment's buckets, or single copy's chunks (nothing packed)
                assert "bucket" in kinds
            for e in inside:  # nested in the collective
                assert (
                    grad["ts"] <= e["ts"] and e["ts"] + e["dur"] <= grad["ts"] + grad["dur"] + 1e-3
                )
    updates = [e for e in events if e["cat"] == "update" and e["pid"] == 0]
    assert [e["args"]["step"] for e in updates] == [0, 1, 2]


def test_nothing_is_recorded_unless_every_rank_records(tmp_path: Path) -> None:
    ranks_dir = tmp_path / "ranks"
    run = run_ranks(
        2,
        SCRIPTS / "collectives.py",
        ["flat", "--only-rank1"],
        env={**QUIET, "MNIFY_TIMELINE": str(ranks_dir)},
        timeout=180,
    )
    assert run.output.count("WRAPPED False") == 2
    assert_passed(run, 2, "collectives")
    assert "MNIFY_TIMELINE is set on 1 of 2 ranks" in run.stderr
    # rank 1 made its file before the ranks compared notes; it holds no event
    assert [p.name for p in ranks_dir.iterdir()] == ["rank-1.timeline"]
    assert timeline_merge.read_file(ranks_dir / "rank-1.timeline").events == []
    run = run_ranks(2, SCRIPTS / "collectives.py", ["flat"], env=QUIET, timeout=180)
    assert run.output.count("WRAPPED False") == 2


def test_gpu_communicator_spans_on_the_cuda_stand_in(tmp_path: Path) -> None:
    """pure_nccl on tests/support/fakecupy (CuPy and NCCL on CPU, events complete at once, a
    constant elapsed time): the plumbing of CUDA-event spans, not their values."""
    ranks_dir = tmp_path / "ranks"
    run = run_ranks(
        2, SCRIPTS / "gpu_spans.py", env={**QUIET, "MNIFY_TIMELINE": str(ranks_dir)}, timeout=180
    )
    assert_passed(run, 2, "gpu spans")
    merged = timeline_merge.merge_directory(ranks_dir)
    assert timeline_merge.validate(merged.trace) == []
    events = x_events(merged.trace)
    for rank in (0, 1):
        gpu = [e for e in events if e["pid"] == rank and e["cat"] == "gpu"]
        spans = sorted((e["args"]["of"], e["name"], e["tid"], e["args"]["step"]) for e in gpu)
        expected = []
        for step in range(3):
            expected += [
                ("collective", "multi_node_mean_grad", timeline_merge.GPU_COMM_TID, step),
                ("optimizer", "optimizer", timeline_merge.GPU_OPTIMIZER_TID, step),
                ("pack", "pack", timeline_merge.GPU_COMM_TID, step),
                ("unpack", "unpack", timeline_merge.GPU_COMM_TID, step),
            ]
        assert spans == sorted(expected)  # none for the barrier: its data is on the host
        grads = [e for e in gpu if e["name"] == "multi_node_mean_grad"]
        assert [e["args"]["seq"] for e in grads] == [1, 2, 3]
        assert all(e["args"]["bytes"] == 4 * (3 + 50 + 7) for e in grads)
    threads = {
        (e["pid"], e["args"]["name"])
        for e in merged.trace["traceEvents"]
        if e["name"] == "thread_name"
    }
    assert {(0, "GPU: communication"), (0, "GPU: optimizer"), (1, "host")} <= threads
