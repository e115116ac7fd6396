"""Merging rank files into one Chrome trace: clock offsets removed, every event valid, ranks that
left no file named (rank files written here with known clocks, no MPI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mnify.launch import timeline_merge as tm
from mnify.runtime.timeline import FLAG_ERROR, Category, Recorder

MS = 1_000_000
HOSTS = ["alpha", "alpha", "beta", "beta"]


def write_rank(
    directory: Path,
    rank: int,
    size: int,
    skew: int,
    *,
    ref: int = 0,
    ref_skew: int = 0,
    error: int = 0,
    job: int = 1,
    collectives: int = 5,
) -> Recorder:
    """Rank ``rank`` whose clock reads true time + ``skew``; it measured its offset from rank
    ``ref`` (whose clock reads true time + ``ref_skew``) with ``error``; one barrier every
    10 ms of true time, each taking 1 ms, inside an update."""
    rec = Recorder(
        directory / f"rank-{rank}.timeline", rank=rank, size=size, host=HOSTS[rank],
        capacity=256, now=lambda: 0,
    )  # fmt: skip
    rec.meta(
        {"t": "comm", "id": 0, "key": "world.0", "class": "flat", "rank": rank, "size": size,
         "world_ranks": list(range(size)), "hosts": HOSTS[:size]}
    )  # fmt: skip
    if rank != ref:
        offset = skew - ref_skew + error
        rec.meta({"t": "clock", "comm": 0, "ref": ref, "offset_ns": offset, "rtt_ns": 2 * abs(error) + 1000, "at_ns": 0})  # fmt: skip
    rec.meta({"t": "job", "comm": 0, "size": size, "token": [job, 7]})
    barrier, update = rec.name_id("barrier"), rec.name_id("update")
    for k in range(collectives):
        t = 1_000 * MS + k * 10 * MS + skew
        rec.add(Category.UPDATE, update, -1, 0, k, 0, -1, t - MS, t + 2 * MS)
        rec.add(Category.COLLECTIVE, barrier, 0, k + 1, k, 64, -1, t, t + MS)
    return rec


def x_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_offsets_are_removed_and_every_event_is_valid(tmp_path: Path) -> None:
    skews = [0, 3_000 * MS, -1_700 * MS]
    for rank, skew in enumerate(skews):
        write_rank(tmp_path, rank, 3, skew).finish()
    merged = tm.merge_directory(tmp_path)
    trace = json.loads(json.dumps(merged.trace))  # what a file holds
    assert tm.validate(trace) == []
    assert merged.ranks == [0, 1, 2] and merged.missing == [] and merged.warnings == []
    assert {e["pid"] for e in x_events(trace)} == {0, 1, 2}
    names = {
        e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {0: "rank 0 (alpha)", 1: "rank 1 (alpha)", 2: "rank 2 (beta)"}
    by_seq: dict[int, list[float]] = {}
    for e in x_events(trace):
        if e["cat"] == "collective":
            assert e["dur"] == pytest.approx(1000.0)
            by_seq.setdefault(e["args"]["seq"], []).append(e["ts"])
    assert sorted(by_seq) == [1, 2, 3, 4, 5]
    for arrivals in by_seq.values():
        assert max(arrivals) - min(arrivals) < 1.0  # microseconds, after seconds of skew
    assert min(e["ts"] for e in x_events(trace)) == 0.0
    info = trace["otherData"]["mnify"]
    assert info["clock_offsets_ms"] == {"0": 0.0, "1": 3000.0, "2": -1700.0}
    assert info["communicators"] == {"world.0": {"size": 3, "class": "flat"}}


def test_offsets_chain_through_sub_communicators(tmp_path: Path) -> None:
    skews = [0, 40 * MS, 90 * MS, -25 * MS]
    write_rank(tmp_path, 0, 4, skews[0])
    write_rank(tmp_path, 1, 4, skews[1], error=MS // 10)
    write_rank(tmp_path, 2, 4, skews[2])
    write_rank(tmp_path, 3, 4, skews[3], ref=2, ref_skew=skews[2])  # measured against rank 2 only
    offsets = tm.merge_directory(tmp_path).offsets
    assert {r: o.offset_ns for r, o in offsets.items()} == {
        0: 0, 1: 40 * MS + MS // 10, 2: 90 * MS, 3: -25 * MS,
    }  # fmt: skip
    assert offsets[1].error_ns >= MS // 10 and all(o.linked for o in offsets.values())


def test_missing_ranks_are_named_with_their_hosts(tmp_path: Path) -> None:
    for rank in (0, 1, 3):
        write_rank(tmp_path, rank, 4, 0)
    with pytest.raises(tm.MissingRanks) as caught:
        tm.merge_directory(tmp_path)
    assert caught.value.missing == [2] and caught.value.size == 4
    assert "rank 2 of 4" in str(caught.value) and "beta" in str(caught.value)
    merged = tm.merge_directory(tmp_path, allow_missing=True)
    assert merged.missing == [2] and merged.trace["otherData"]["mnify"]["missing_ranks"] == [2]
    assert tm.validate(merged.trace) == []


def test_files_of_other_jobs_or_none_at_all_are_refused(tmp_path: Path) -> None:
    with pytest.raises(tm.MergeError, match="no timeline files"):
        tm.merge_directory(tmp_path)
    write_rank(tmp_path, 0, 2, 0, job=1)
    write_rank(tmp_path, 1, 2, 0, job=2)
    with pytest.raises(tm.MergeError, match="different jobs"):
        tm.merge_directory(tmp_path)
    (tmp_path / "rank-1.timeline").write_bytes(b"garbage")
    with pytest.raises(tm.MergeError, match="rank-1.timeline"):
        tm.merge_directory(tmp_path)


def test_unfinished_failed_and_device_events(tmp_path: Path) -> None:
    rec = write_rank(tmp_path, 0, 2, 0)
    write_rank(tmp_path, 1, 2, 0, collectives=6).finish()
    clock = iter([2_000 * MS, 1_030 * MS])
    rec.now = lambda: next(clock)
    rec.open(Category.COLLECTIVE, rec.name_id("allreduce"), 0, 6, 8, -1)  # never ends
    gpu = rec.name_id("multi_node_mean_grad")
    rec.add(Category.DEVICE, gpu, 0, 3, 2, 64, int(Category.COLLECTIVE), 1_021 * MS, 1_022 * MS)
    rec.add(Category.DEVICE, rec.name_id("optimizer"), -1, 0, 2, 0, int(Category.APPLY), 1_022 * MS, 1_023 * MS)  # fmt: skip
    number = rec.open(Category.BUCKET, rec.name_id("bucket"), 0, 1, 32, 6)
    rec.flag(number, FLAG_ERROR)
    merged = tm.merge_directory(tmp_path)
    assert tm.validate(merged.trace) == []
    events = x_events(merged.trace)
    last = max(e["ts"] + e["dur"] for e in events)
    (stuck,) = [e for e in events if e["name"] == "allreduce"]
    assert stuck["args"]["unfinished"] and stuck["ts"] + stuck["dur"] == last
    (failed,) = [e for e in events if e["cat"] == "bucket"]
    assert failed["args"]["error"] and failed["args"]["seq"] == 6 and failed["args"]["bucket"] == 1
    gpu_events = {(e["tid"], e["args"]["of"]) for e in events if e["cat"] == "gpu"}
    assert gpu_events == {(tm.GPU_COMM_TID, "collective"), (tm.GPU_OPTIMIZER_TID, "optimizer")}
    threads = {(e["pid"], e["args"]["name"]) for e in merged.trace["traceEvents"] if e["name"] == "thread_name"}  # fmt: skip
    assert (0, "GPU: communication") in threads and (1, "host") in threads
    assert any("rank 0: the process did not exit normally" in w for w in merged.warnings)


def test_trace_file_round_trip(tmp_path: Path) -> None:
    for rank in range(2):
        write_rank(tmp_path, rank, 2, rank * MS)
    out = tmp_path / "trace.json"
    tm.write_trace(out, tm.merge_directory(tmp_path).trace)
    loaded = tm.load_trace(out)
    assert tm.validate(loaded) == [] and len(x_events(loaded)) == 20
    out.write_text('{"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": 1}]}')
    with pytest.raises(tm.MergeError, match="not a valid trace"):
        tm.load_trace(out)


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"events": []},
        {"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": 0, "dur": -1}]},
        {"traceEvents": [{"ph": "X", "name": "a", "pid": "0", "tid": 0, "ts": 0, "dur": 1}]},
        {
            "traceEvents": [
                {"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": float("nan"), "dur": 1}
            ]
        },
        {"traceEvents": [{"ph": "B", "name": "a", "pid": 0, "tid": 0, "ts": 0}]},
        {"traceEvents": [{"ph": "M", "name": "colour", "pid": 0, "tid": 0, "args": {}}]},
        {"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 1}]},
    ],
)
def test_validate_finds_what_is_not_trace_event_format(bad: Any) -> None:
    assert tm.validate(bad)


def test_mnify_run_merges_keeps_incomplete_directories_and_says_why(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    ranks = tm.run_directory(trace)
    assert ranks == trace.absolute().with_name("t.json.ranks")
    tm.prepare_run_directory(ranks)
    nothing = tm.finish_run(trace, ranks, 2)
    assert nothing.stragglers == [] and "no timeline files" in nothing.lines[0]
    assert not trace.exists()

    (ranks / "notes.txt").write_text("mine")  # not ours: never removed
    write_rank(ranks, 0, 2, 0)
    partial = tm.finish_run(trace, ranks, 2)
    assert tm.validate(tm.load_trace(trace)) == [] and (ranks / "rank-0.timeline").exists()
    assert any(
        "no timeline from rank 1 of 2 (they ran on alpha)" in line
        and f"mnify timeline --merge {ranks} -o {trace}" in line
        for line in partial.lines
    ), partial.lines

    write_rank(ranks, 1, 2, 0)
    whole = tm.finish_run(trace, ranks, 2)
    assert whole.lines[0].startswith(f"mnify run: timeline: {trace}: 20 events of 2 of 2 ranks")
    assert sorted(p.name for p in ranks.iterdir()) == ["notes.txt"]
    (ranks / "notes.txt").unlink()
    write_rank(ranks, 0, 2, 0)
    write_rank(ranks, 1, 2, 0)
    tm.finish_run(trace, ranks, 2)
    assert not ranks.exists()
    tm.prepare_run_directory(ranks)
    write_rank(ranks, 0, 2, 0)
    tm.prepare_run_directory(ranks)  # an earlier run's files are cleared
    assert list(ranks.iterdir()) == []
