"""Where slabs begin and end: the differentiable boundaries of a spatially parallel model.

Under spatial parallelism (:func:`mnify.runtime.links.create_spatial_parallel_model`) every rank
holds one slab of rows of each activation and the same copy of every parameter. The loss is
computed identically on every rank (a replicated head), so each rank's backward yields the
gradient of that one loss through *its* slab. The adjoints follow:

* :class:`InputSlab` (the whole input, present on every rank -> this rank's rows): backward puts
  this rank's rows of the input gradient in place and sums over the group, when the input needs
  a gradient at all;
* :class:`ReplicatedSum` (a reduction over the slab axis: per-slab partial sums -> their total on
  every rank): what follows is replicated, so every rank already holds the total's gradient,
  which is the gradient of its own partial sum: backward is the identity, no communication;
* :class:`GatherSlabs` (slabs -> the whole tensor on every rank, for a model whose output is
  still a map): backward keeps this rank's rows;
* :class:`SumGradOverGroup` (a parameter, identity forward): backward sums the per-slab partial
  gradients over the group, so after ``backward()`` every rank holds the one-process gradient;
* :class:`SlabMark` (identity) records on the graph which rows of which axis its output holds;
  :func:`layout_of` reads it back for any variable derived by row-local functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import chainer

from mnify.runtime.functions.collective_communication import (
    allreduce_sum,
    array_module,
    grad_or_zeros,
    like_module,
)
from mnify.runtime.functions.halo_exchange import SlabLayout, _take

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


class SlabMark(chainer.FunctionNode):
    """Identity; its output is the slab ``layout.bounds[rank]`` of a ``layout.full``-row axis."""

    def __init__(self, layout: SlabLayout) -> None:
        self.layout = layout

    @property
    def label(self) -> str:
        return "SlabMark"

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return inputs

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        return grad_outputs


def mark_slab(x: Any, layout: SlabLayout) -> chainer.Variable:
    """``x`` (this rank's rows) tagged with its layout."""
    y: chainer.Variable = SlabMark(layout).apply((x,))[0]
    return y


class InputSlab(SlabMark):
    """The whole input (the same on every rank) -> this rank's rows of it."""

    def __init__(self, comm: CommunicatorBase, layout: SlabLayout) -> None:
        super().__init__(layout)
        self.comm = comm
        self.full: Any = None

    @property
    def label(self) -> str:
        return "InputSlab"

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        (x,) = inputs
        self.full = x
        start, stop = self.layout.bounds[self.comm.rank]
        return (_take(x, self.layout.axis, start, stop),)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        x = self.full
        xp = array_module(x)
        gx = xp.zeros(x.shape, dtype=x.dtype)
        gy = grad_outputs[0]
        if gy is not None:
            start, stop = self.layout.bounds[self.comm.rank]
            _take(gx, self.layout.axis, start, stop)[...] = gy.array
        return (chainer.Variable(allreduce_sum(self.comm, gx)),)


class GatherSlabs(chainer.FunctionNode):
    """Every rank's slab -> the whole tensor on every rank; backward keeps this rank's rows."""

    def __init__(self, comm: CommunicatorBase, layout: SlabLayout) -> None:
        self.comm = comm
        self.layout = layout

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any]:
        (y,) = inputs
        xp = array_module(y)
        parts = [like_module(p, xp) for p in self.comm.allgather(xp.ascontiguousarray(y))]
        return (xp.concatenate(parts, axis=self.layout.axis),)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        gy = grad_outputs[0]
        if gy is None:
            return (None,)
        start, stop = self.layout.bounds[self.comm.rank]
        own = _take(gy.array, self.layout.axis, start, stop)
        return (chainer.Variable(array_module(own).ascontiguousarray(own)),)


class ReplicatedSum(chainer.FunctionNode):
    """Sum of every rank's partial result (forward allreduce); backward is the identity."""

    def __init__(self, comm: CommunicatorBase) -> None:
        self.comm = comm

    @property
    def label(self) -> str:
        return "ReplicatedSum"

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any]:
        (x,) = inputs
        xp = array_module(x)
        return (allreduce_sum(self.comm, xp.ascontiguousarray(x)).reshape(x.shape),)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        return grad_outputs


class SumGradOverGroup(chainer.FunctionNode):
    """Identity on a parameter; backward sums its gradient over the spatial group."""

    def __init__(self, comm: CommunicatorBase) -> None:
        self.comm = comm

    @property
    def label(self) -> str:
        return "SumGradOverGroup"

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        (w,) = inputs
        self.meta = (w.shape, w.dtype, array_module(w))
        return (w,)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        shape, dtype, xp = self.meta
        g = grad_or_zeros(grad_outputs[0], shape, dtype, xp)
        return (chainer.Variable(allreduce_sum(self.comm, xp.ascontiguousarray(g))),)


def sum_grad_over_group(comm: CommunicatorBase, w: Any) -> Any:
    """``w`` as used by one rank's slab: its gradient is summed over ``comm`` in backward."""
    if w is None or comm.size == 1:
        return w
    return SumGradOverGroup(comm).apply((w,))[0]


def replicated_sum(comm: CommunicatorBase, x: Any) -> chainer.Variable:
    """The total of every rank's ``x`` on every rank (see :class:`ReplicatedSum`)."""
    y: chainer.Variable = ReplicatedSum(comm).apply((x,))[0]
    return y


def gather_slabs(comm: CommunicatorBase, x: Any, layout: SlabLayout) -> chainer.Variable:
    """The whole tensor whose slab this rank holds as ``x``, on every rank."""
    y: chainer.Variable = GatherSlabs(comm, layout).apply((x,))[0]
    return y


__all__ = [
    "GatherSlabs",
    "InputSlab",
    "ReplicatedSum",
    "SlabMark",
    "SumGradOverGroup",
    "gather_slabs",
    "mark_slab",
    "replicated_sum",
    "sum_grad_over_group",
]
