"""The rules rank 0 applies to the ranks' records (mnify.runtime.verify.judge), without MPI:
where each check's line between "finding" and "not a finding" lies."""

from __future__ import annotations

from typing import Any

import numpy as np

from mnify.runtime.verify.judge import RankRecord, judge

U = np.uint64


def record(rank: int, drawn: list[int], source: list[int] | None = None, **kw: Any) -> RankRecord:
    base: dict[str, Any] = {
        "rank": rank,
        "drawn": np.asarray(drawn, U),
        "call_where": "train.py:10",
        "source_what": "the dataset of a SerialIterator",
        "source": np.asarray(source or [], U),
        "digests": {},
        "optimizers": [
            {
                "key": "0:SGD on Classifier",
                "name": "SGD on Classifier",
                "multi_node": True,
                "where": "train.py:20",
                "lr": 0.1,
            }
        ],
        "unwrapped": {},
        "writes": [],
        "per_rank_batch": len(drawn) // 3 or None,
        "iterations_per_epoch": None,
    }
    base.update(kw)
    return RankRecord(**base)


def checks(records: list[RankRecord]) -> list[tuple[str, list[int]]]:
    return [(f.check, f.ranks) for f in judge(records, 3).findings]


def test_force_equal_length_repeats_of_at_most_size_minus_one_are_not_same_data() -> None:
    shards = [list(range(0, 34)), list(range(33, 67)), list(range(66, 100))]  # 2 repeats
    assert checks([record(r, s, s) for r, s in enumerate(shards)]) == []
    shards[2] = [*shards[2], 0]  # a third example on two ranks
    assert checks([record(r, s) for r, s in enumerate(shards)]) == [("same-data", [0, 1, 2])]


def test_a_whole_dataset_shuffled_per_rank_is_caught_by_its_source() -> None:
    full = list(range(1000, 7000))
    rng = np.random.RandomState(0)
    drawn = [list(rng.choice(full, 96, replace=False)) for _ in range(2)]
    drawn[1] = [d for d in drawn[1] if d not in set(drawn[0])]  # no overlap in what was drawn
    found = judge([record(r, d, full) for r, d in enumerate(drawn)], 3).findings
    assert [(f.check, f.ranks) for f in found] == [("same-data", [0, 1])]
    assert "6000 examples" in found[0].message
    # sources sharing under half of the smaller one (natural duplicates): not a finding
    halves = [full[:3000] + full[:1000], full[3000:] + full[:1000]]
    assert (
        checks([record(r, d, s) for r, (d, s) in enumerate(zip(drawn, halves, strict=True))]) == []
    )


def test_params_differ_names_the_first_update_and_the_paths() -> None:
    same = {"/l1/W": 1, "/l1/b": 2}
    records = [
        record(0, [1], digests={"0:SGD on Classifier": {1: same, 2: {"/l1/W": 5, "/l1/b": 2}}}),
        record(1, [2], digests={"0:SGD on Classifier": {1: same, 2: {"/l1/W": 6, "/l1/b": 2}}}),
    ]
    found = judge(records, 3).findings
    assert [(f.check, f.ranks, f.where) for f in found] == [
        ("params-differ", [0, 1], "train.py:20")
    ]
    assert found[0].message.startswith("after update 2 of optimizer SGD on Classifier, /l1/W ")


def test_model_parallel_runs_expect_the_same_data_and_plain_optimizers() -> None:
    kw = {"model_parallel": ["channel-parallel link /conv1"], "unwrapped": {"0:SGD": "t.py:3"}}
    records = [record(r, [1, 2, 3], [1, 2, 3], **kw) for r in range(2)]
    report = judge(records, 3)
    assert report.findings == [] and report.model_parallel == ["channel-parallel link /conv1"]


def test_rank_writes_group_ranks_and_ignore_rank_0() -> None:
    write = ("opened for writing", "log.txt", "train.py:40")
    records = [record(r, [r], writes=[write]) for r in range(3)]
    found = judge(records, 3).findings
    assert [(f.check, f.ranks, f.where) for f in found] == [("rank-writes", [1, 2], "train.py:40")]
    assert "log.txt" in found[0].message


def test_examples_repeated_inside_a_ranks_own_data_do_not_count() -> None:
    """A toy dataset of 6 patterns, correctly scattered: every rank holds every pattern."""
    patterns = list(range(6))
    shards = [patterns * 5 + [100 + r * 10 + i for i in range(3)] for r in range(2)]
    assert checks([record(r, s[:20] + s[-3:], s) for r, s in enumerate(shards)]) == []
    # the same toy dataset, not scattered: its unique examples still give it away
    whole = patterns * 5 + [200, 201, 202]
    assert checks([record(r, whole[-3:], whole) for r in range(2)]) == [("same-data", [0, 1])]


def test_model_parallel_global_batch_is_one_ranks_batch() -> None:
    kw = {"model_parallel": ["a multi-node iterator sends rank 0's batches to every rank"]}
    report = judge([record(r, [1, 2, 3], **kw) for r in range(2)], 3)
    assert report.per_rank_batch == {"0": 1, "1": 1} and report.global_batch == 1
