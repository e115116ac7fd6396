"""Pooling and reductions on slabs: what ``F.max_pooling_2d`` & co. do inside a spatial model.

While a spatially parallel model runs, ``chainer.functions.max_pooling_2d``,
``average_pooling_2d``, ``sum``, ``average`` and ``mean`` are routed here; on a tensor that is
not a slab they call Chainer's own function unchanged.

* Pooling: the output rows are split evenly over the ranks; each rank gathers the input rows its
  windows read (:class:`~mnify.runtime.functions.halo_exchange.HaloGather`; windows may cross
  slab boundaries and strides need not align with them), pads only at the true image borders
  (``-inf`` for max, 0 for average, as Chainer does), and pools with Chainer's function.
* A reduction over the slab axis sums the slabs' partial results over the group
  (:class:`~mnify.runtime.functions.slab_functions.ReplicatedSum`); a mean divides by the
  whole image's count. The result is the same on every rank. A reduction over other axes only
  stays a slab.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import chainer
import chainer.functions as F

from mnify.runtime.functions.halo_exchange import (
    HaloPlan,
    SlabLayout,
    halo_gather,
    rows_needed,
    window_output_size,
)
from mnify.runtime.functions.slab_functions import InputSlab, mark_slab, replicated_sum

if TYPE_CHECKING:
    from mnify.runtime.links.spatial_group import SpatialGroup

#: Chainer's own functions, captured before any routing
ORIGINAL: dict[str, Callable[..., Any]] = {
    "max_pooling_2d": F.max_pooling_2d,
    "average_pooling_2d": F.average_pooling_2d,
    "sum": F.sum,
    "average": F.average,
    "mean": F.mean,
}


def pair(x: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(x, Sequence):
        a, b = x
        return int(a), int(b)
    return int(x), int(x)


def window_plan(
    group: SpatialGroup,
    layout: SlabLayout,
    ksize: int,
    stride: int,
    pad: int,
    dilate: int = 1,
    cover_all: bool = False,
) -> tuple[SlabLayout, HaloPlan]:
    """Output layout (rows split evenly) and the halo every rank needs for a window op."""
    out_rows = window_output_size(layout.full, ksize, stride, pad, dilate, cover_all)
    if out_rows < 1:
        raise ValueError(f"a window of {ksize} rows does not fit {layout.full} rows")
    out_layout = SlabLayout.even(layout.axis, out_rows, group.size)
    need = tuple(rows_needed(a, b, ksize, stride, pad, dilate) for a, b in out_layout.bounds)
    return out_layout, HaloPlan(layout, need, group.rank)


def full_input_of(x: chainer.Variable) -> Any:
    """The whole input array when ``x`` is the model's input slab and needs no gradient (its
    halo can then be read locally instead of exchanged)."""
    creator = x.creator_node
    if isinstance(creator, InputSlab) and not x.requires_grad:
        return creator.full
    return None


def first_rows(y: Any, rows: int, axis: int) -> Any:
    """The first ``rows`` rows of ``y`` along ``axis``, always through one indexing node, even
    when that is all of them: every rank then builds the same graph, whose backward visits the
    layers (and their collectives) in the same order on every rank."""
    index: list[Any] = [slice(None)] * y.ndim
    index[axis] = slice(0, rows)
    return y[tuple(index)]


def keep_rows(y: Any, layout: SlabLayout, rank: int) -> Any:
    """``y`` cut to this rank's output row count (an empty slab computes one window)."""
    return first_rows(y, layout.rows(rank), layout.axis)


def _pool(
    group: SpatialGroup,
    x: chainer.Variable,
    layout: SlabLayout,
    name: str,
    ksize: Any,
    stride: Any,
    pad: Any,
    fill: float,
    **kwargs: Any,
) -> chainer.Variable:
    k, p = pair(ksize), pair(pad)
    s = pair(stride if stride is not None else ksize)
    a = layout.axis - 2
    cover_all = bool(kwargs.get("cover_all", False))
    out_layout, plan = window_plan(group, layout, k[a], s[a], p[a], 1, cover_all)
    ext = halo_gather(group.comm, x, plan, fill, full_input_of(x))
    local_pad = (0, p[1]) if a == 0 else (p[0], 0)
    y = ORIGINAL[name](ext, k, s, local_pad, **kwargs)
    return mark_slab(keep_rows(y, out_layout, group.rank), out_layout)


def max_pooling_2d(
    group: SpatialGroup,
    x: chainer.Variable,
    layout: SlabLayout,
    ksize: Any,
    stride: Any = None,
    pad: Any = 0,
    cover_all: bool = True,
    return_indices: bool = False,
) -> chainer.Variable:
    if return_indices:
        raise NotImplementedError("max_pooling_2d(return_indices=True) on a spatial slab")
    return _pool(
        group, x, layout, "max_pooling_2d", ksize, stride, pad, float("-inf"), cover_all=cover_all
    )


def average_pooling_2d(
    group: SpatialGroup,
    x: chainer.Variable,
    layout: SlabLayout,
    ksize: Any,
    stride: Any = None,
    pad: Any = 0,
) -> chainer.Variable:
    return _pool(group, x, layout, "average_pooling_2d", ksize, stride, pad, 0.0)


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(int(a) % ndim for a in axes))


def reduce(
    group: SpatialGroup,
    x: chainer.Variable,
    layout: SlabLayout,
    name: str,
    axis: Any = None,
    weights: Any = None,
    keepdims: bool = False,
) -> chainer.Variable:
    """``F.sum`` / ``F.average`` / ``F.mean`` of a slab (see the module doc)."""
    if weights is not None:
        raise NotImplementedError(f"F.{name}(weights=...) on a spatial slab")
    axes = _axes(axis, x.ndim)
    local = ORIGINAL["sum"](x, axis=axes, keepdims=keepdims)
    if layout.axis not in axes:
        out = local if name == "sum" else ORIGINAL[name](x, axis=axes, keepdims=keepdims)
        shift = 0 if keepdims else sum(1 for a in axes if a < layout.axis)
        return mark_slab(out, SlabLayout(layout.axis - shift, layout.full, layout.bounds))
    total = replicated_sum(group.comm, local)
    if name == "sum":
        return total
    count = 1
    for a in axes:
        count *= layout.full if a == layout.axis else int(x.shape[a])
    scaled: Any = total
    mean: chainer.Variable = scaled * (1.0 / count)
    return mean


__all__ = ["ORIGINAL", "average_pooling_2d", "max_pooling_2d", "pair", "reduce", "window_plan"]
