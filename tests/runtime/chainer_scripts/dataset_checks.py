"""Rank script: scatter_dataset / scatter_index split like ChainerMN and send only each share.

The expected share of rank r is ChainerMN's ``SubDataset(dataset, b, e, order)``; here every
rank compares what it received with that, example by example, and the root checks coverage.
"""

from __future__ import annotations

from typing import Any

import chainer
import numpy as np

from mnify.runtime.datasets.empty_dataset import create_empty_dataset
from mnify.runtime.datasets.scatter_dataset import (
    IndexedDataset,
    scatter_dataset,
    scatter_index,
    split_ranges,
)
from tests.support.rank_checks import make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size


def add_one(example: Any) -> Any:
    """A module-level transform, so TransformDataset shares can be pickled."""
    x, y = example
    return x + 1, y


class Squares(chainer.dataset.DatasetMixin):  # type: ignore[misc]
    """An opaque dataset that computes examples on demand; counts how often it was indexed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __len__(self) -> int:
        return self.n

    def get_example(self, i: int) -> Any:
        self.calls += 1
        return i * i


def as_plain(example: Any) -> Any:
    """Examples as comparable Python values (arrays become lists)."""
    if isinstance(example, dict):
        return {k: as_plain(v) for k, v in sorted(example.items())}
    if isinstance(example, tuple):
        return tuple(as_plain(v) for v in example)
    if isinstance(example, np.ndarray | np.generic):
        return np.asarray(example).tolist()
    return example


def build(kind: str, n: int) -> Any:
    rng = np.random.RandomState(n)
    x = rng.randn(n, 3).astype(np.float32)
    y = np.arange(n, dtype=np.int32)
    if kind == "ndarray":
        return x
    if kind == "tuple":
        return chainer.datasets.TupleDataset(x, y)
    if kind == "dict":
        return chainer.datasets.DictDataset(x=x, y=y)
    if kind == "list":
        return [(f"item{i}", i) for i in range(n)]
    if kind == "subdataset":
        base = chainer.datasets.TupleDataset(rng.randn(n + 4, 2), np.arange(n + 4))
        return chainer.datasets.SubDataset(base, 2, n + 2, order=rng.permutation(n + 4))
    if kind == "transform":
        return chainer.datasets.TransformDataset(chainer.datasets.TupleDataset(x, y), add_one)
    if kind == "opaque":
        return Squares(n)
    raise ValueError(kind)


def check_split(kind: str, n: int, *, root: int, shuffle: bool, force: bool) -> None:
    full = build(kind, n)  # every rank can build it, to know what to expect
    seed = 5 if shuffle else None
    got = scatter_dataset(
        full if rank == root else None,
        comm,
        root=root,
        shuffle=shuffle,
        seed=seed,
        force_equal_length=force,
    )
    if kind == "opaque" and rank == root:
        assert full.calls == 0, f"the root evaluated {full.calls} examples of a lazy dataset"
    order = np.random.RandomState(seed).permutation(n) if shuffle else None
    begin, end = split_ranges(n, size, force)[rank]
    expected = chainer.datasets.SubDataset(full, begin, end, order)
    what = f"{kind} n={n} root={root} shuffle={shuffle} force={force}"
    assert len(got) == len(expected), f"{what}: {len(got)} examples, expected {len(expected)}"
    assert [as_plain(got[i]) for i in range(len(got))] == [
        as_plain(expected[i]) for i in range(len(expected))
    ], what
    if kind in ("ndarray", "tuple", "dict", "subdataset", "transform"):
        # array-backed: the share arrived as arrays holding exactly the share
        parts = {
            "ndarray": lambda: [got],
            "tuple": lambda: list(got._datasets),
            "dict": lambda: list(got._datasets.values()),
            "subdataset": lambda: list(got._datasets),
            "transform": lambda: list(got._dataset._datasets),
        }[kind]()
        for part in parts:
            assert isinstance(part, np.ndarray) and len(part) == len(expected), (what, type(part))
    if kind == "opaque":
        assert isinstance(got, IndexedDataset), type(got)

    shares = comm.gather_obj([as_plain(got[i]) for i in range(len(got))], root=0)
    if rank == 0:
        everything = [as_plain(full[i]) for i in range(n)]
        if order is not None:
            everything = [everything[i] for i in order]
        lengths = [len(s) for s in shares]
        if force:
            assert lengths == [-(-n // size)] * size, (what, lengths)
            seen = {repr(e) for s in shares for e in s}
            assert seen == {repr(e) for e in everything}, f"{what}: not every example scattered"
        else:
            assert max(lengths) - min(lengths) <= 1, (what, lengths)
            assert [e for s in shares for e in s] == everything, f"{what}: not a partition in order"


for kind in ("ndarray", "tuple", "dict", "list", "subdataset", "transform", "opaque"):
    for n in (11, 12):
        check_split(kind, n, root=0, shuffle=False, force=True)
        check_split(kind, n, root=0, shuffle=False, force=False)
        check_split(kind, n, root=size - 1, shuffle=True, force=True)
        check_split(kind, n, root=0, shuffle=True, force=False)
passed("dataset kinds: ChainerMN's shares, coverage, seeded shuffle, both modes", comm)

check_split("tuple", 2, root=0, shuffle=False, force=False)  # some ranks get nothing
check_split("ndarray", 1, root=0, shuffle=True, force=True)
passed("fewer examples than ranks", comm)

a = scatter_dataset(build("tuple", 20) if rank == 0 else None, comm, shuffle=True, seed=9)
b = scatter_dataset(build("tuple", 20) if rank == 0 else None, comm, shuffle=True, seed=9)
assert [as_plain(e) for e in a] == [as_plain(e) for e in b], "same seed, different split"
# a non-root's dataset argument is ignored
c = scatter_dataset(build("tuple", 20) if rank == 0 else ["ignored"], comm)
assert len(c) == -(-20 // size)
passed("same seed gives the same split; non-root arguments are ignored", comm)

for n in (0, 7, 10):
    for force in (True, False):
        assert scatter_index(n if rank == 0 else -1, comm, force_equal_length=force) == tuple(
            split_ranges(n, size, force)[rank]
        )
try:
    scatter_dataset(None, comm, root=size)
except ValueError as error:
    assert "root" in str(error)
else:
    raise AssertionError("a root outside the communicator must be refused")
via_mpi4py = scatter_dataset(build("tuple", 10) if rank == 0 else None, comm.mpi_comm)
assert [as_plain(e) for e in via_mpi4py] == [
    as_plain(e) for e in scatter_dataset(build("tuple", 10) if rank == 0 else None, comm)
]
assert scatter_index(10, comm.mpi_comm) == tuple(split_ranges(10, size)[rank])
passed("scatter_index and root validation; bare mpi4py communicators", comm)

empty = create_empty_dataset(build("tuple", 7))
assert len(empty) == 7 and all(e == () for e in empty)
passed("create_empty_dataset", comm)
