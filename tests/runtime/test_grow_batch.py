"""GrowBatch: the batch grown instead of the learning rate decayed, exact against one process.

One 2-rank launch (tests/runtime/chainer_scripts/grow_batch_checks.py) trains three cases --
growth, growth with micro-batch accumulation, the hybrid past ``max_batch`` -- each against one
process that grows its own batch (or halves its rate) at the same triggers, and counts the
gradient all-reduces per epoch. Without ranks: the micro-batch arithmetic and the checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import chainer
import chainer.links as L
import numpy as np
import pytest

from mnify.runtime.extensions import grow_batch
from tests.runtime.chainer_scripts.launch import SCRIPTS
from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

CASES = ("grow", "accumulate", "hybrid")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    where = tmp_path_factory.mktemp("grow_batch")
    run = run_ranks(2, SCRIPTS / "grow_batch_checks.py", timeout=300, cwd=where)
    for rank in range(2):
        assert not missing(run.rank_lines(rank), ["grow_batch"]), run.describe()
    return {
        case: [json.loads((where / f"{case}.r{r}.json").read_text()) for r in range(2)]
        for case in CASES
    }


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_equal_one_process_growing_alike(
    results: dict[str, list[dict[str, Any]]], case: str
) -> None:
    for rank_result in results[case]:
        assert rank_result["max_rel_diff"] <= 1e-10, (case, rank_result)
    assert results[case][0] == results[case][1]  # every rank took the same schedule


def test_accumulation_halves_the_all_reduces_after_a_doubling(
    results: dict[str, list[dict[str, Any]]],
) -> None:
    acc = results["accumulate"][0]
    # 24 examples: 6 steps of 4, then 3 of 8; one all-reduce a step whatever the micro-batches
    assert acc["allreduces_per_epoch"][:2] == [6, 3]
    # max_per_rank=1: a share of 2 runs 2 micro-batches, of 4 runs 4, of 8 runs 8
    assert acc["micro_batches"][:9] == [2] * 6 + [4] * 3 and set(acc["micro_batches"][9:]) == {8}
    assert results["grow"][0]["allreduces_per_epoch"] == acc["allreduces_per_epoch"]


def test_past_max_batch_the_rate_is_divided_instead(
    results: dict[str, list[dict[str, Any]]],
) -> None:
    hybrid = results["hybrid"][0]
    assert hybrid["final_batch"] == 8 and hybrid["grown"] == 1 and hybrid["lr_divided"] == 2
    assert hybrid["lr"] == pytest.approx(0.05 / 4)
    assert hybrid["allreduces_per_epoch"] == [6, 3, 3]


@pytest.mark.parametrize(
    ("share", "count", "sizes"),
    [(8, 1, [8]), (8, 3, [3, 3, 2]), (2, 4, [1, 1, 0, 0]), (0, 2, [0, 0])],
)
def test_micro_batches_cut_a_share_evenly(share: int, count: int, sizes: list[int]) -> None:
    assert grow_batch.micro_batch_sizes(share, count) == sizes


def test_every_rank_runs_as_many_micro_batches_as_the_largest_share_needs() -> None:
    assert grow_batch.micro_batch_count([5, 4, 4], None) == 1
    assert grow_batch.micro_batch_count([5, 4, 4], 5) == 1
    assert grow_batch.micro_batch_count([5, 4, 4], 2) == 3
    assert grow_batch.micro_batch_count([0, 1], 1) == 1


def test_the_rate_divided_is_the_optimizers_own() -> None:
    model = L.Linear(2, 2)
    sgd, adam = chainer.optimizers.MomentumSGD(lr=0.1), chainer.optimizers.Adam(alpha=0.01)
    sgd.setup(model)
    adam.setup(model)
    assert grow_batch.learning_rate_name(sgd) == "lr"
    assert grow_batch.learning_rate_name(adam) == "alpha"  # Adam's lr is derived from alpha


def test_bad_arguments_and_iterators_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="integer of at least 2"):
        grow_batch.GrowBatch(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_per_rank"):
        grow_batch.GrowBatch(2, max_per_rank=0)
    model = L.Classifier(L.Linear(2, 2))
    opt = chainer.optimizers.SGD()
    opt.setup(model)
    data = chainer.datasets.TupleDataset(np.zeros((4, 2), np.float32), np.zeros(4, np.int32))
    it = chainer.iterators.SerialIterator(data, 2)
    trainer = chainer.training.Trainer(
        chainer.training.StandardUpdater(it, opt), (1, "iteration"), out=str(tmp_path)
    )
    with pytest.raises(TypeError, match="create_global_batch_iterator"):
        grow_batch.GrowBatch(2).initialize(trainer)
