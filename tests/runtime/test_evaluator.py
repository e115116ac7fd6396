"""create_multi_node_evaluator on 2 and 3 ranks: means weighted by examples, uneven shards."""

from __future__ import annotations

import pytest

from mnify.runtime.extensions.multi_node_evaluator import combine_rank_means
from tests.runtime.chainer_scripts.launch import run_script

CHECKS = [
    "weighted by examples: uneven shards and short batches match one process",
    "ranks with empty shards",
    "custom evaluate weighted by iterator counts",
    "inside a trainer, reported as validation/main/*",
    "distribute_extensions: a helper's evaluator and writers made data-parallel",
]


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [2, 3])
def test_multi_node_evaluator(n_ranks: int) -> None:
    run_script(n_ranks, "evaluator_checks.py", CHECKS)


def test_combine_rank_means() -> None:
    combined = combine_rank_means(
        [{"loss": (1.0, 3.0), "acc": (0.5, 3.0)}, {"loss": (3.0, 1.0)}, {}]
    )
    assert combined == {"acc": 0.5, "loss": 1.5}
    # in the order the evaluator reported them (a PrintReport's columns follow it)
    assert list(combined) == ["loss", "acc"]
    # no weights known at all: plain mean of the ranks that reported
    assert combine_rank_means([{"x": (1.0, 0.0)}, {"x": (2.0, 0.0)}]) == {"x": 1.5}
