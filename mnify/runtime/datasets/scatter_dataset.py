"""Split a dataset held by one rank among all ranks, sending each rank only its share.

The splits are ChainerMN's: contiguous ranges of the (optionally shuffled) example order whose
sizes differ by at most one; with ``force_equal_length`` every rank gets ``ceil(n / size)``
examples, the ranges of neighbouring ranks overlapping where ``n`` does not divide.

ChainerMN pickles the whole dataset and broadcasts it, so every rank briefly holds all of it.
Here the root cuts each rank's share out and sends only that:

* array-backed datasets (numpy arrays, ``TupleDataset``/``DictDataset`` of them, ``SubDataset`` and
  ``TransformDataset`` over those) travel as the rows of the share, received straight into arrays;
  CuPy arrays travel the same way through host memory and land on each rank's current device;
* Python lists and tuples travel as the pickled list of the share's examples;
* any other dataset (lazy ones such as ``LabeledImageDataset`` that read files when indexed) is
  pickled as an object together with the share's indices, so nothing is loaded on the root.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


def split_ranges(n_total: int, size: int, force_equal_length: bool = True) -> list[tuple[int, int]]:
    """The ``[begin, end)`` range of each rank, ChainerMN's split.

    ``force_equal_length``: rank ``i`` starts at ``n * i // size`` and takes ``ceil(n / size)``
    examples (ranges overlap by at most one example; the last range ends at ``n``). Otherwise the
    first ``n % size`` ranks take one example more and nothing is repeated.
    """
    if size <= 0 or n_total < 0:
        raise ValueError(f"cannot split {n_total} examples among {size} ranks")
    if force_equal_length:
        length = -(-n_total // size)
        return [(n_total * i // size, n_total * i // size + length) for i in range(size)]
    ranges = []
    begin = 0
    for i in range(size):
        length = n_total // size + (1 if i < n_total % size else 0)
        ranges.append((begin, begin + length))
        begin += length
    return ranges


def scatter_index(
    n_total_samples: int, comm: CommunicatorBase, root: int = 0, *, force_equal_length: bool = True
) -> tuple[int, int]:
    """This rank's ``(begin, end)`` of ``n_total_samples`` examples; only ``root``'s count is used."""
    comm = _as_communicator(comm)
    _check_root(comm, root)
    ranges = (
        split_ranges(n_total_samples, comm.size, force_equal_length) if comm.rank == root else None
    )
    begin, end = comm.scatter_obj(ranges, root=root)
    return int(begin), int(end)


def scatter_dataset(
    dataset: Any,
    comm: CommunicatorBase,
    root: int = 0,
    shuffle: bool = False,
    seed: int | None = None,
    max_buf_len: int | None = None,
    *,
    force_equal_length: bool = True,
) -> Any:
    """Give each rank its share of ``root``'s ``dataset`` (other ranks pass ``None``).

    ``shuffle`` permutes the examples first with ``numpy.random.RandomState(seed)`` (with a fixed
    ``seed`` every example always lands on the same rank). Keep ``force_equal_length`` on for
    training and for the multi-node evaluator, which need the same number of iterations on every
    rank; turn it off for an exact, duplicate-free evaluation split. ``max_buf_len`` is accepted
    for ChainerMN compatibility and ignored (nothing is broadcast). ``comm`` may also be a bare
    mpi4py communicator, as in ChainerMN.
    """
    del max_buf_len
    comm = _as_communicator(comm)
    _check_root(comm, root)
    if comm.rank != root:
        spec = comm.recv_obj(source=root, tag=_TAG)
        received = [comm.recv(source=root, tag=_TAG) for _ in range(spec.n_arrays)]
        return _remember_share(_assemble(spec.layout, iter(received)))
    if dataset is None:
        raise ValueError(f"scatter_dataset: the root rank {root} passed dataset=None")
    n_total = len(dataset)
    order = np.random.RandomState(seed).permutation(n_total) if shuffle else None
    mine = None
    for rank, (begin, end) in enumerate(split_ranges(n_total, comm.size, force_equal_length)):
        indices = np.arange(begin, end) if order is None else order[begin:end]
        arrays: list[np.ndarray] = []
        layout = _cut(dataset, indices, arrays)
        if rank == root:
            mine = _assemble(layout, iter(arrays))
            continue
        comm.send_obj(_ShareSpec(layout, len(arrays)), dest=rank, tag=_TAG)
        for array in arrays:
            comm.send(np.ascontiguousarray(array), dest=rank, tag=_TAG)
        del arrays
    return _remember_share(mine)


# Results of scatter_dataset in this process, by id: a weak reference (dropped with the share),
# or the share itself where it cannot be weakly referenced (a list of examples), which keeps it
# alive so that its id is never reused while it is here.
_SHARES: dict[int, Any] = {}


def _remember_share(share: Any) -> Any:
    key = id(share)

    def forget(_: object) -> None:
        _SHARES.pop(key, None)

    try:
        _SHARES[key] = weakref.ref(share, forget)
    except TypeError:
        _SHARES[key] = share
    return share


def is_share(dataset: Any, depth: int = 4) -> bool:
    """Whether ``dataset`` is (or wraps, as a ``SubDataset`` or ``TransformDataset`` does) a
    share this process received from :func:`scatter_dataset`: distributing it again would split
    it once more."""
    for _ in range(depth):
        if dataset is None:
            return False
        known = _SHARES.get(id(dataset))
        if known is dataset or (isinstance(known, weakref.ref) and known() is dataset):
            return True
        dataset = getattr(dataset, "_dataset", None)
    return False


# Messages of one scatter_dataset call; a tag of its own keeps them apart from the user's.
_TAG = 7301


def _as_communicator(comm: Any) -> CommunicatorBase:
    """ChainerMN also accepts a bare mpi4py communicator: wrap one in a ``naive`` communicator."""
    from mpi4py import MPI

    if isinstance(comm, MPI.Intracomm):
        from mnify.runtime.communicators import create_communicator

        return create_communicator("naive", mpi_comm=comm)
    return comm  # type: ignore[no-any-return]


def _check_root(comm: CommunicatorBase, root: int) -> None:
    if not 0 <= root < comm.size:
        raise ValueError(f"root {root} is not a rank of a communicator of size {comm.size}")


@dataclass
class _ShareSpec:
    """What the root sends first: the share's layout and how many arrays follow."""

    layout: Any
    n_arrays: int


class IndexedDataset(chainer.dataset.DatasetMixin):  # type: ignore[misc]
    """The examples ``indices`` of ``base``, fetched from ``base`` only when asked for."""

    def __init__(self, base: Any, indices: Sequence[int]) -> None:
        self._base = base
        self._indices = np.asarray(indices)

    def __len__(self) -> int:
        return len(self._indices)

    def get_example(self, i: int) -> Any:
        return self._base[int(self._indices[i])]


def _is_device_array_leaf(x: Any) -> bool:
    """A CuPy array of examples (checked by type name: CuPy is not imported on CPU ranks)."""
    return type(x).__module__.split(".")[0] == "cupy" and getattr(x, "ndim", 0) >= 1


def _is_array_leaf(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype != object and x.ndim >= 1


def _take(array: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Rows ``indices`` of ``array``: a view when they are one contiguous run, else a copy."""
    if len(indices) == 0:
        return array[:0]
    first = int(indices[0])
    if int(indices[-1]) == first + len(indices) - 1 and bool(np.all(np.diff(indices) == 1)):
        return array[first : first + len(indices)]
    return array[indices]


def _cut(dataset: Any, indices: np.ndarray, arrays: list[np.ndarray]) -> Any:
    """The share ``indices`` of ``dataset`` as a picklable layout; its arrays go to ``arrays``.

    A layout is a tuple whose first item says how to rebuild the share (see :func:`_assemble`).
    """
    if _is_device_array_leaf(dataset):
        # travels through host memory; each rank puts its share on its current device
        arrays.append(dataset[indices].get())
        return ("device_array",)
    if _is_array_leaf(dataset):
        arrays.append(_take(dataset, indices))
        return ("array",)
    if isinstance(dataset, chainer.datasets.TupleDataset):
        return ("tuple", [_cut(part, indices, arrays) for part in dataset._datasets])
    if isinstance(dataset, chainer.datasets.DictDataset):
        return (
            "dict",
            {key: _cut(part, indices, arrays) for key, part in dataset._datasets.items()},
        )
    if isinstance(dataset, chainer.datasets.SubDataset):
        base_indices = dataset._start + indices
        if dataset._order is not None:
            base_indices = np.asarray(dataset._order)[base_indices]
        return _cut(dataset._dataset, base_indices, arrays)
    if isinstance(dataset, chainer.datasets.TransformDataset):
        return ("transform", dataset._transform, _cut(dataset._dataset, indices, arrays))
    if isinstance(dataset, (list, tuple)):
        return ("examples", [dataset[int(i)] for i in indices])
    return ("indexed", dataset, indices)


def _assemble(layout: Any, arrays: Iterator[np.ndarray]) -> Any:
    """Rebuild a share from its layout and its arrays, in the order :func:`_cut` emitted them."""
    kind = layout[0]
    if kind == "array":
        return next(arrays)
    if kind == "device_array":
        import cupy

        return cupy.asarray(next(arrays))
    if kind == "tuple":
        return chainer.datasets.TupleDataset(*[_assemble(part, arrays) for part in layout[1]])
    if kind == "dict":
        return chainer.datasets.DictDataset(
            **{key: _assemble(part, arrays) for key, part in layout[1].items()}
        )
    if kind == "transform":
        return chainer.datasets.TransformDataset(_assemble(layout[2], arrays), layout[1])
    if kind == "examples":
        return layout[1]
    if kind == "indexed":
        return IndexedDataset(layout[1], layout[2])
    raise ValueError(f"unknown share layout {kind!r}")
