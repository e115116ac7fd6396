"""scatter_dataset, scatter_index, create_empty_dataset: ChainerMN's splits, only the share sent."""

from __future__ import annotations

import pytest

from mnify.runtime.datasets.scatter_dataset import split_ranges
from tests.runtime.chainer_scripts.launch import run_script

CHECKS = [
    "dataset kinds: ChainerMN's shares, coverage, seeded shuffle, both modes",
    "fewer examples than ranks",
    "same seed gives the same split; non-root arguments are ignored",
    "scatter_index and root validation; bare mpi4py communicators",
    "create_empty_dataset",
]


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [2, 3])
def test_scatter_dataset_on_ranks(n_ranks: int) -> None:
    run_script(n_ranks, "dataset_checks.py", CHECKS)


@pytest.mark.mpi
def test_scatter_device_arrays_with_cupy_stand_in() -> None:
    run_script(
        2, "dataset_device_checks.py", ["CuPy arrays arrive as CuPy arrays holding only the share"]
    )


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
    """``mn.scatter_dataset`` etc. are the functions on every access, not their same-named modules.

    Fails while the lazy facade (mnify/_lazy.py) does not cache resolved names: importing
    ``mnify.runtime.datasets.scatter_dataset`` binds the package attribute to the module.
    """
    import types

    from mnify import runtime as mn

    for _ in range(2):
        for value in (
            mn.scatter_dataset,
            mn.datasets.scatter_dataset,
            mn.scatter_index,
            mn.create_empty_dataset,
            mn.links.create_mnbn_model,
            mn.create_multi_node_optimizer,
        ):
            assert isinstance(value, types.FunctionType), value


class _OneRank:
    rank = 0
    size = 1


def test_converted_scripts_can_call_the_facade_twice() -> None:
    """What converted scripts do: scatter train, then test, through ``mn``; copy a model twice."""
    import chainer.links as L

    from mnify import runtime as mn

    for _ in range(2):
        assert len(mn.scatter_dataset(list(range(5)), _OneRank(), shuffle=True)) == 5
        assert len(mn.datasets.scatter_dataset(list(range(3)), _OneRank())) == 3
        assert isinstance(mn.links.create_mnbn_model(L.Linear(2, 2), None), L.Linear)
