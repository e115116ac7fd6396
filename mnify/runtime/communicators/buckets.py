"""Bucket plans: how a list of arrays is cut into pieces for one collective each, on host and
device alike, and where a mean's 1/size scale is applied.

Reducing 100 MB in one MPI call ran ~6x slower under Open MPI's shared-memory transport than the
same bytes in 1-4 MB pieces, and a small bucket stays in cache between pack, reduce and unpack.
So gradients are walked in order and cut into buckets of at most ``bucket_bytes``: large arrays
in buckets of their own, reduced straight from their memory; small ones packed together. One
staging buffer of the largest bucket's size (numpy on the host, CuPy on a GPU: the caller says
how to allocate it) is kept per layout and reused for every bucket and every step.
``bucket_bytes=None`` puts everything in one packed bucket (NCCL pipelines large buffers
itself, and one kernel launch packs them all).

The scale of a mean is applied *before* the sum, in the first pass that touches the data, so
float16 sums cannot overflow where the mean would not and no pass is added for it
(:func:`place_scale`): the reduction itself when it can average (NCCL's ``ncclAvg``) and the
wire is at least float32, else fused into packing (or into publishing, for the shared-memory
segment), else -- a bucket reduced in its own memory -- in place just before it is reduced.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mnify.runtime import kernels

# (array index, first element, one past the last element) of one piece of one array
Piece = tuple[int, int, int]
LayoutKey = tuple[Any, ...]
# how a plan makes its staging buffer: (elements, dtype) -> a 1-D array (numpy.empty by default)
Allocate = Callable[[int, np.dtype[Any]], Any]


def plan_buckets(
    sizes: Sequence[int], per_bucket: int | None, alone_from: int | None = None
) -> list[list[Piece]]:
    """Buckets of at most ``per_bucket`` elements over arrays of ``sizes`` elements, in order.

    Arrays of at least ``alone_from`` elements (default and at most: half a bucket) get buckets
    of their own, split evenly when larger than one, so they can be reduced straight from their
    own memory; smaller arrays are packed together, in order, into shared buckets and never
    span two. ``per_bucket=None``: one bucket holding every non-empty array.
    """
    if per_bucket is None:
        whole = [(i, 0, int(n)) for i, n in enumerate(sizes) if n]
        return [whole] if whole else []
    per_bucket = max(1, int(per_bucket))
    half = -(-per_bucket // 2)
    alone = half if alone_from is None else min(half, max(1, int(alone_from)))
    buckets: list[list[Piece]] = []
    current: list[Piece] = []
    room = per_bucket
    for index, size in enumerate(int(s) for s in sizes):
        if size == 0:
            continue
        if size >= alone:
            count = -(-size // per_bucket)
            bounds = [size * k // count for k in range(count + 1)]
            buckets.extend([[(index, lo, hi)] for lo, hi in zip(bounds, bounds[1:], strict=False)])
            continue
        if size > room:
            buckets.append(current)
            current, room = [], per_bucket
        current.append((index, 0, size))
        room -= size
    if current:
        buckets.append(current)
    return buckets


def bucket_size(bucket: Sequence[Piece]) -> int:
    return sum(hi - lo for _, lo, hi in bucket)


@dataclass(frozen=True)
class ScalePlacement:
    """Where a bucket's scale goes: ``before`` multiplies the data before the sum (fused into
    packing or publishing, or in place for a bucket reduced in its own memory); ``average``:
    the reduction itself averages over ranks (then ``before`` is 1)."""

    before: float
    average: bool


def place_scale(
    scale: float, wire: np.dtype[Any], average_over: int | None = None
) -> ScalePlacement:
    """The one policy for the 1/size of a mean, host and device alike (see the module doc).

    ``average_over``: the reduction can average over this many ranks (NCCL >= 2.10's
    ``ncclAvg``); None: it only sums (MPI, the shared-memory segment). Averaging in the
    reduction is used for a scale of exactly 1/ranks on float32/float64 wires only: NCCL
    multiplies each input by 1/ranks in the wire dtype, which for float16 would round the
    factor itself, while packing multiplies in float32 and rounds once.
    """
    if scale == 1.0:
        return ScalePlacement(1.0, False)
    if (
        average_over is not None
        and average_over > 1
        and scale == 1.0 / average_over
        and np.dtype(wire).itemsize >= 4
    ):
        return ScalePlacement(1.0, True)
    return ScalePlacement(float(scale), False)


def reduced_in_place(views: Sequence[Any], wire: np.dtype[Any]) -> bool:
    """A bucket that is one piece already in the wire dtype is reduced in the array's own
    memory (no packing)."""
    return len(views) == 1 and np.dtype(views[0].dtype) == np.dtype(wire)


@dataclass
class BucketPlan:
    """Buckets over arrays of fixed sizes, and the reusable staging buffer they pass through."""

    buckets: list[list[Piece]]
    buffer: Any

    @classmethod
    def build(
        cls,
        sizes: Sequence[int],
        wire_dtype: np.dtype[Any],
        bucket_bytes: int | None,
        own_bucket_bytes: int | None = None,
        allocate: Allocate | None = None,
    ) -> BucketPlan:
        """:func:`plan_buckets` with byte sizes in ``wire_dtype``, plus a staging buffer of the
        largest bucket's size made by ``allocate`` (default: ``numpy.empty``)."""
        itemsize = wire_dtype.itemsize
        per_bucket = None if bucket_bytes is None else max(1, bucket_bytes // itemsize)
        alone = None if own_bucket_bytes is None else max(1, own_bucket_bytes // itemsize)
        buckets = plan_buckets(sizes, per_bucket, alone)
        largest = max((bucket_size(b) for b in buckets), default=0)
        make = allocate or (lambda n, dtype: np.empty(n, dtype=dtype))
        return cls(buckets, make(largest, wire_dtype))

    def run(
        self,
        flats: Sequence[np.ndarray],
        allreduce_inplace: Callable[[np.ndarray], None],
        scale: float = 1.0,
    ) -> None:
        """Reduce the pieces of the 1-D host ``flats`` bucket by bucket with
        ``allreduce_inplace`` (a sum), times ``scale`` (applied as :func:`place_scale` says).

        A bucket that is one piece already in the wire dtype is scaled and reduced in the
        array's own memory (no copies: Open MPI reduces faster in place than into another
        buffer, bench/allreduce.py). Otherwise the pieces are packed into the staging buffer
        with the scale fused, reduced there, and unpacked.
        """
        before = place_scale(scale, self.buffer.dtype).before
        for views, buf in self.pieces(flats):
            if reduced_in_place(views, buf.dtype):
                piece = views[0]
                if before != 1.0:
                    kernels.unpack(piece, [piece], before)
                allreduce_inplace(piece)
            else:
                kernels.pack(views, buf, before)
                allreduce_inplace(buf)
                kernels.unpack(buf, views)

    def pieces(self, flats: Sequence[Any]) -> Iterator[tuple[list[Any], Any]]:
        """Per bucket: views of its pieces in ``flats`` and the staging buffer's first elements."""
        for bucket in self.buckets:
            views = [flats[i][lo:hi] for i, lo, hi in bucket]
            yield views, self.buffer[: bucket_size(bucket)]


class PlanCache:
    """Plans keyed by the layout (dtypes and shapes) of the arrays, a few kept at a time."""

    def __init__(self, keep: int = 8) -> None:
        self._plans: OrderedDict[LayoutKey, BucketPlan] = OrderedDict()
        self._keep = keep

    def get(
        self,
        arrays: Sequence[Any],
        wire_dtype: np.dtype[Any],
        bucket_bytes: int | None,
        tag: Any = "",
        own_bucket_bytes: int | None = None,
        allocate: Allocate | None = None,
    ) -> BucketPlan:
        """The plan for ``arrays``; ``tag`` keeps plans of different uses (and their buffers)
        apart, e.g. one per CUDA stream."""
        key: LayoutKey = (
            tag,
            wire_dtype.str,
            bucket_bytes,
            own_bucket_bytes,
            tuple((np.dtype(a.dtype).str, tuple(a.shape)) for a in arrays),
        )
        plan = self._plans.get(key)
        if plan is None:
            sizes = [int(a.size) for a in arrays]
            plan = BucketPlan.build(sizes, wire_dtype, bucket_bytes, own_bucket_bytes, allocate)
            self._plans[key] = plan
            while len(self._plans) > self._keep:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan

    def clear(self) -> None:
        self._plans.clear()
