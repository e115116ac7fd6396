"""scatter_dataset, scatter_index, create_empty_dataset: ChainerMN's splits, only the share sent."""

from __future__ import annotations

import pytest

from mnify.runtime.datasets.scatter_dataset import split_ranges
from tests.runtime.chainer_scripts.launch import run_script

CHECKS = [
    "every dataset kind: ChainerMN's shares, coverage, shuffle with seed, both length modes",
    "fewer examples than ranks",
    "same seed gives the same split; non-root arguments are ignored",
    "scatter_index and root validation",
    "create_empty_dataset",
]


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [2, 3])
def test_scatter_dataset_on_ranks(n_ranks: int) -> None:
    run_script(n_ranks, "dataset_checks.py", CHECKS)


def test_split_ranges_are_chainermns() -> None:
    chainermn_scatter = pytest.importorskip("chainermn.datasets.scatter")
    for size in range(1, 9):
        for n in range(0, 40):
            for force in (True, False):
                expected = [(b, e) for _, b, e in chainermn_scatter._scatter_index(n, size, force)]
                assert split_ranges(n, size, force) == expected, (n, size, force)


def test_split_ranges_lengths() -> None:
    for size in range(1, 6):
        for n in range(0, 30):
            equal = split_ranges(n, size, True)
            assert {e - b for b, e in equal} == {-(-n // size)}
            assert all(0 <= b <= e <= n for b, e in equal)
            exact = split_ranges(n, size, False)
            assert exact[0][0] == 0 and exact[-1][1] == n
            assert all(exact[i][1] == exact[i + 1][0] for i in range(size - 1))
    with pytest.raises(ValueError):
        split_ranges(3, 0)


def test_public_names_stay_functions() -> None:
    """``mn.scatter_dataset`` etc. are the functions on every access, not their same-named modules."""
    from mnify import runtime as mn

    for _ in range(2):
        assert callable(mn.scatter_dataset)
        assert callable(mn.datasets.scatter_dataset)
        assert callable(mn.scatter_index)
        assert callable(mn.create_empty_dataset)
        assert callable(mn.links.create_mnbn_model)
        assert callable(mn.create_multi_node_optimizer)
