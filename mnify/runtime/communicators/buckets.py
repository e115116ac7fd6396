"""Bucket plans: how a list of arrays is cut into fixed-size pieces for one collective each.

Reducing 100 MB in one MPI call ran ~6x slower under Open MPI's shared-memory transport than the
same bytes in 1-4 MB pieces, and a small bucket stays in cache between pack, reduce and unpack.
So gradients are walked in order and cut into buckets of at most ``bucket_bytes``: large arrays
in buckets of their own, reduced straight from their memory; small ones packed together. One
staging buffer of a bucket's size is allocated per
layout and reused for every bucket and every step.
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


@dataclass
class BucketPlan:
    """Buckets over arrays of fixed sizes, and the reusable staging buffer they pass through."""

    buckets: list[list[Piece]]
    buffer: np.ndarray

    @classmethod
    def build(
        cls,
        sizes: Sequence[int],
        wire_dtype: np.dtype[Any],
        bucket_bytes: int,
        own_bucket_bytes: int | None = None,
    ) -> BucketPlan:
        """Arrays of at least ``own_bucket_bytes`` (default: half a bucket) get buckets of their
        own (split evenly when larger than one), so they can be reduced straight from their own
        memory; smaller arrays are packed together, in order, into shared buckets."""
        per_bucket = max(1, bucket_bytes // wire_dtype.itemsize)
        half = -(-per_bucket // 2)
        alone_from = half
        if own_bucket_bytes is not None:
            alone_from = min(half, max(1, own_bucket_bytes // wire_dtype.itemsize))
        buckets: list[list[Piece]] = []
        current: list[Piece] = []
        room = per_bucket
        for index, size in enumerate(sizes):
            if size == 0:
                continue
            if size >= alone_from:
                count = -(-size // per_bucket)
                bounds = [size * k // count for k in range(count + 1)]
                buckets.extend(
                    [[(index, lo, hi)] for lo, hi in zip(bounds, bounds[1:], strict=False)]
                )
                continue
            if size > room:
                buckets.append(current)
                current, room = [], per_bucket
            current.append((index, 0, size))
            room -= size
        if current:
            buckets.append(current)
        largest = max((sum(hi - lo for _, lo, hi in b) for b in buckets), default=0)
        return cls(buckets, np.empty(largest, dtype=wire_dtype))

    def run(
        self,
        flats: Sequence[np.ndarray],
        allreduce_inplace: Callable[[np.ndarray], None],
        scale: float = 1.0,
    ) -> None:
        """Reduce the pieces of the 1-D ``flats`` bucket by bucket with ``allreduce_inplace``,
        times ``scale``.

        A bucket that is one piece already in the wire dtype is reduced in the array's own memory
        and scaled in place (no copies). Otherwise the pieces are packed into the staging buffer
        with the scale fused into packing, reduced there, and unpacked. Measured on 2 ranks
        (bench/allreduce.py): Open MPI reduces faster in place than into another buffer, and
        the scale costs one pass over memory either way, so it is fused where a pass is made.
        """
        for views, buf in self.pieces(flats):
            if len(views) == 1 and views[0].dtype == buf.dtype:
                piece = views[0]
                allreduce_inplace(piece)
                if scale != 1.0:
                    kernels.unpack(piece, [piece], scale)
            else:
                kernels.pack(views, buf, scale)
                allreduce_inplace(buf)
                kernels.unpack(buf, views)

    def pieces(self, flats: Sequence[np.ndarray]) -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
        for bucket in self.buckets:
            views = [flats[i][lo:hi] for i, lo, hi in bucket]
            n = sum(hi - lo for _, lo, hi in bucket)
            yield views, self.buffer[:n]


class PlanCache:
    """Plans keyed by the layout (dtypes and shapes) of the arrays, a few kept at a time."""

    def __init__(self, keep: int = 8) -> None:
        self._plans: OrderedDict[LayoutKey, BucketPlan] = OrderedDict()
        self._keep = keep

    def get(
        self,
        arrays: Sequence[np.ndarray],
        wire_dtype: np.dtype[Any],
        bucket_bytes: int,
        tag: str = "",
        own_bucket_bytes: int | None = None,
    ) -> BucketPlan:
        key: LayoutKey = (
            tag,
            wire_dtype.str,
            bucket_bytes,
            own_bucket_bytes,
            tuple((a.dtype.str, a.shape) for a in arrays),
        )
        plan = self._plans.get(key)
        if plan is None:
            sizes = [a.size for a in arrays]
            plan = BucketPlan.build(sizes, wire_dtype, bucket_bytes, own_bucket_bytes)
            self._plans[key] = plan
            while len(self._plans) > self._keep:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan
