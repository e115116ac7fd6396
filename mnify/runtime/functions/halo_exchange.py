"""Slabs of rows and the halo exchange between them: the differentiable core of spatial parallelism.

An activation of global shape ``(N, C, H, W)`` is split along one spatial axis (rows, ``axis=2``,
or columns, ``axis=3``) into one contiguous slab per rank of the spatial group; slabs may be
uneven or empty. A :class:`SlabLayout` says which global rows every rank holds.

A layer with a window (convolution, pooling) needs, for its own output rows, a few input rows its
neighbours hold. :func:`rows_needed` computes that range from kernel size, stride, padding and
dilation; :class:`HaloGather` assembles it: the rank's own rows, the rows received from whichever
ranks hold the rest (usually one neighbour each side, further ones when slabs are thinner than
the halo), and a fill value (0, or -inf for max pooling) for rows outside the image, i.e. the
padding, which only exists at the true image borders. Backward sends the gradient of every
received row back to its owner, who adds it to its own rows' gradient.

Every rank computes every other rank's needs from the same geometry, so messages carry no
header: each side knows what it sends and what it receives
(:meth:`~mnify.runtime.communicators.transport.Transport.start_exchange`).
Bytes sent are counted in :data:`counters` (the benchmark reads them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np

from mnify.runtime import kernels
from mnify.runtime.functions.collective_communication import array_module, like_module

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

#: bytes and messages this process sent in halo exchanges (forward and backward), and how
#: many forward exchanges overlapped an interior computation, for measurements and tests
counters: dict[str, int] = {"halo_bytes_sent": 0, "halo_messages_sent": 0, "overlapped": 0}

Bounds = tuple[tuple[int, int], ...]


def even_bounds(rows: int, size: int) -> Bounds:
    """``[start, stop)`` per rank: ``rows // size`` each, one more for the first ``rows % size``."""
    bounds, start = [], 0
    for r in range(size):
        n = rows // size + (1 if r < rows % size else 0)
        bounds.append((start, start + n))
        start += n
    return tuple(bounds)


@dataclass(frozen=True)
class SlabLayout:
    """Which rows of a ``full``-row axis each rank of the spatial group holds."""

    axis: int
    full: int
    bounds: Bounds

    @classmethod
    def even(cls, axis: int, full: int, size: int) -> SlabLayout:
        return cls(axis, full, even_bounds(full, size))

    def rows(self, rank: int) -> int:
        start, stop = self.bounds[rank]
        return stop - start


def window_output_size(
    size: int, ksize: int, stride: int, pad: int, dilate: int = 1, cover_all: bool = False
) -> int:
    """Chainer's output length of a window op (convolution: ``cover_all=False``; pooling may
    cover the last partial window)."""
    extent = dilate * (ksize - 1) + 1
    if cover_all:
        return (size + 2 * pad - extent + stride - 1) // stride + 1
    return (size + 2 * pad - extent) // stride + 1


def rows_needed(
    out_start: int, out_stop: int, ksize: int, stride: int, pad: int, dilate: int
) -> tuple[int, int]:
    """Global input rows ``[lo, hi)`` (may reach into the padding: < 0 or >= H) that output
    rows ``[out_start, out_stop)`` of a window op read. Empty output: one window's rows (the
    caller discards its result; it keeps the layer's parameters in every rank's graph)."""
    extent = dilate * (ksize - 1) + 1
    if out_stop <= out_start:
        out_stop = out_start + 1
    return out_start * stride - pad, (out_stop - 1) * stride - pad + extent


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if hi > lo else (lo, lo)


def _take(x: Any, axis: int, start: int, stop: int) -> Any:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


@dataclass(frozen=True)
class HaloPlan:
    """What one rank sends, receives and keeps for one window op (global row numbers)."""

    layout: SlabLayout
    need: tuple[tuple[int, int], ...]  # per rank: padded input range [lo, hi) its outputs read
    rank: int

    def clipped(self, r: int) -> tuple[int, int]:
        lo, hi = self.need[r]
        return max(lo, 0), min(hi, self.layout.full)

    def sends(self) -> list[tuple[int, tuple[int, int]]]:
        """(peer, my rows it needs) for every peer that needs some of mine."""
        mine = self.layout.bounds[self.rank]
        out = []
        for q in range(len(self.need)):
            if q != self.rank:
                lo, hi = _overlap(mine, self.clipped(q))
                if hi > lo:
                    out.append((q, (lo, hi)))
        return out

    def recvs(self) -> list[tuple[int, tuple[int, int]]]:
        """(peer, its rows I need) for every peer holding some of what I read."""
        want = self.clipped(self.rank)
        out = []
        for q, held in enumerate(self.layout.bounds):
            if q != self.rank:
                lo, hi = _overlap(held, want)
                if hi > lo:
                    out.append((q, (lo, hi)))
        return out

    def own(self) -> tuple[int, int]:
        return _overlap(self.layout.bounds[self.rank], self.clipped(self.rank))


def _on_host(x: Any) -> np.ndarray:
    return np.ascontiguousarray(chainer.backend.CpuDevice().send(x))


class HaloGather(chainer.FunctionNode):
    """Input: this rank's slab. Output: the rows ``need[rank]`` of the whole activation, the
    neighbours' halo rows received, padding rows filled with ``fill``.

    ``full_input`` (the whole array, present on every rank: the model's input) lets the
    exchange be skipped: the rows are taken from it. Only used when no input gradient is needed.
    """

    def __init__(
        self,
        comm: CommunicatorBase,
        plan: HaloPlan,
        fill: float = 0.0,
        full_input: Any = None,
        tag: int = 0,
    ) -> None:
        self.comm = comm
        self.plan = plan
        self.fill = fill
        self.full_input = full_input
        self.tag = tag

    @property
    def label(self) -> str:
        return "HaloGather"

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any]:
        (x,) = inputs
        xp = array_module(x)
        plan, axis = self.plan, self.plan.layout.axis
        start = plan.layout.bounds[plan.rank][0]
        lo, hi = plan.need[plan.rank]
        shape = list(x.shape)
        shape[axis] = hi - lo
        self.x_meta = (tuple(x.shape), x.dtype, xp)
        if self.full_input is not None:
            source = self.full_input
            clo, chi = plan.clipped(plan.rank)
            body = _take(source, axis, clo, chi)
            return (kernels.halo_unpack([(clo - lo, body)], tuple(shape), axis, self.fill, xp),)
        buffers = [
            (q, np.empty(_shape_with(x.shape, axis, b - a), dtype=x.dtype))
            for q, (a, b) in plan.recvs()
        ]
        outgoing = [
            (q, _on_host(kernels.halo_pack(x, axis, a - start, b - start)))
            for q, (a, b) in plan.sends()
        ]
        self._count(outgoing)
        requests = self.comm.start_exchange(outgoing, buffers, tag=self.tag)
        own_lo, own_hi = plan.own()
        pieces = [(own_lo - lo, _take(x, axis, own_lo - start, own_hi - start))]
        self.comm.finish_exchange(requests)
        for (_, (a, _b)), (_, buf) in zip(plan.recvs(), buffers, strict=True):
            pieces.append((a - lo, like_module(buf, xp)))
        return (kernels.halo_unpack(pieces, tuple(shape), axis, self.fill, xp),)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable]:
        shape, dtype, xp = self.x_meta
        plan, axis = self.plan, self.plan.layout.axis
        start = plan.layout.bounds[plan.rank][0]
        lo = plan.need[plan.rank][0]
        gy = grad_outputs[0]
        g: Any = gy.array if gy is not None else None
        out_shape = list(shape)
        out_shape[axis] = plan.need[plan.rank][1] - lo
        if g is None:
            g = xp.zeros(tuple(out_shape), dtype=dtype)
        # what I received in forward goes back to its owner; what I sent comes back to me
        outgoing = [
            (q, _on_host(kernels.halo_pack(g, axis, a - lo, b - lo))) for q, (a, b) in plan.recvs()
        ]
        buffers = [
            (q, np.empty(_shape_with(shape, axis, b - a), dtype=dtype))
            for q, (a, b) in plan.sends()
        ]
        self._count(outgoing)
        requests = self.comm.start_exchange(outgoing, buffers, tag=self.tag)
        gx = xp.zeros(shape, dtype=dtype)
        own_lo, own_hi = plan.own()
        if own_hi > own_lo:
            _take(gx, axis, own_lo - start, own_hi - start)[...] += _take(
                g, axis, own_lo - lo, own_hi - lo
            )
        self.comm.finish_exchange(requests)
        for (_, (a, b)), (_, buf) in zip(plan.sends(), buffers, strict=True):
            _take(gx, axis, a - start, b - start)[...] += like_module(buf, xp)
        return (chainer.Variable(gx),)

    @staticmethod
    def _count(outgoing: Sequence[tuple[int, np.ndarray]]) -> None:
        counters["halo_bytes_sent"] += sum(int(a.nbytes) for _, a in outgoing)
        counters["halo_messages_sent"] += len(outgoing)


def _shape_with(shape: Sequence[int], axis: int, n: int) -> tuple[int, ...]:
    out = list(shape)
    out[axis] = n
    return tuple(out)


def halo_gather(
    comm: CommunicatorBase,
    x: Any,
    plan: HaloPlan,
    fill: float = 0.0,
    full_input: Any = None,
) -> chainer.Variable:
    """The rows ``plan.need[rank]`` of the activation whose slab this rank holds as ``x``
    (collective over the spatial group when a halo must travel)."""
    return HaloGather(comm, plan, fill, full_input).apply((x,))[0]


__all__ = [
    "HaloGather",
    "HaloPlan",
    "SlabLayout",
    "counters",
    "even_bounds",
    "halo_gather",
    "rows_needed",
    "window_output_size",
]
