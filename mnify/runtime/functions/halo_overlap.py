"""The halo exchange split in two, so a convolution's interior is computed while halos travel.

:func:`halo_edges` posts the exchange (:class:`HaloStart`), lets the caller compute the output
rows that read only this rank's own rows (the interior), then waits (:class:`HaloFinish`) and
returns just the input rows the two edges of the output need: the top edge's and the bottom
edge's, each from own rows, received rows and padding. Backward is split the same way:
``HaloFinish`` posts the halo gradients back to their owners and the receives of the gradients of
rows this rank sent, the interior's backward runs, and ``HaloStart`` waits and adds them.

Same messages, same bytes as :class:`~mnify.runtime.functions.halo_exchange.HaloGather`; the
two must agree row for row (the rank tests run both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import chainer
import numpy as np

from mnify.runtime import kernels
from mnify.runtime.functions.collective_communication import array_module, like_module
from mnify.runtime.functions.halo_exchange import (
    HaloGather,
    HaloPlan,
    _on_host,
    _overlap,
    _shape_with,
    _take,
    counters,
)

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

Span = tuple[int, int]


class _Exchange:
    """State shared by the two halves: what is in flight, and what arrived."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.keep: list[Any] = []  # send buffers, alive until the wait
        self.received: list[tuple[Span, Any]] = []


class HaloStart(chainer.FunctionNode):
    """Input: the slab. Output: a zero-size token. Posts the halo messages."""

    def __init__(self, comm: CommunicatorBase, plan: HaloPlan, state: _Exchange) -> None:
        self.comm = comm
        self.plan = plan
        self.state = state

    @property
    def label(self) -> str:
        return "HaloStart"

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any]:
        (x,) = inputs
        plan, axis, state = self.plan, self.plan.layout.axis, self.state
        start = plan.layout.bounds[plan.rank][0]
        self.x_meta = (tuple(x.shape), x.dtype, array_module(x))
        buffers = [
            (q, np.empty(_shape_with(x.shape, axis, b - a), dtype=x.dtype))
            for q, (a, b) in plan.recvs()
        ]
        outgoing = [
            (q, _on_host(kernels.halo_pack(x, axis, a - start, b - start)))
            for q, (a, b) in plan.sends()
        ]
        HaloGather._count(outgoing)
        state.requests = self.comm.start_exchange(outgoing, buffers)
        state.keep = outgoing
        state.received = [
            (span, buf) for (_, span), (_, buf) in zip(plan.recvs(), buffers, strict=True)
        ]
        counters["overlapped"] += 1
        return (array_module(x).empty((0,), dtype=np.float32),)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable]:
        shape, dtype, xp = self.x_meta
        plan, axis, state = self.plan, self.plan.layout.axis, self.state
        start = plan.layout.bounds[plan.rank][0]
        self.comm.finish_exchange(state.requests)
        gx = xp.zeros(shape, dtype=dtype)
        for (a, b), buf in state.received:
            _take(gx, axis, a - start, b - start)[...] += like_module(buf, xp)
        state.requests, state.keep, state.received = [], [], []
        return (chainer.Variable(gx),)


class HaloFinish(chainer.FunctionNode):
    """Inputs: the slab and the token. Outputs: the input rows ``spans`` (global, padded) need."""

    def __init__(
        self,
        comm: CommunicatorBase,
        plan: HaloPlan,
        state: _Exchange,
        spans: tuple[Span, ...],
    ) -> None:
        self.comm = comm
        self.plan = plan
        self.state = state
        self.spans = spans

    @property
    def label(self) -> str:
        return "HaloFinish"

    def _own(self) -> Span:
        return self.plan.layout.bounds[self.plan.rank]

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        x, _token = inputs
        xp = array_module(x)
        axis = self.plan.layout.axis
        self.x_meta = (tuple(x.shape), x.dtype, xp)
        self.comm.finish_exchange(self.state.requests)
        own = self._own()
        sources = [(own, x), *((span, like_module(buf, xp)) for span, buf in self.state.received)]
        outs = []
        for lo, hi in self.spans:
            pieces = []
            for (a, b), block in sources:
                c, d = _overlap((a, b), (lo, hi))
                if d > c:
                    pieces.append((c - lo, _take(block, axis, c - a, d - a)))
            shape = _shape_with(x.shape, axis, hi - lo)
            if not pieces:
                pieces.append((0, _take(x, axis, 0, 0)))
            outs.append(kernels.halo_unpack(pieces, shape, axis, 0.0, xp))
        self.state.received = []
        return tuple(outs)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable, chainer.Variable]:
        shape, dtype, xp = self.x_meta
        plan, axis, state = self.plan, self.plan.layout.axis, self.state
        grads = [
            g.array if g is not None else xp.zeros(_shape_with(shape, axis, hi - lo), dtype=dtype)
            for g, (lo, hi) in zip(grad_outputs, self.spans, strict=True)
        ]

        def gathered(span: Span) -> Any:
            """The gradient of global rows ``span``, summed over the edges that read them."""
            a, b = span
            total = xp.zeros(_shape_with(shape, axis, b - a), dtype=dtype)
            for g, (lo, hi) in zip(grads, self.spans, strict=True):
                c, d = _overlap((a, b), (lo, hi))
                if d > c:
                    _take(total, axis, c - a, d - a)[...] += _take(g, axis, c - lo, d - lo)
            return total

        outgoing = [(q, _on_host(gathered(span))) for q, span in plan.recvs()]
        buffers = [
            (q, np.empty(_shape_with(shape, axis, b - a), dtype=dtype))
            for q, (a, b) in plan.sends()
        ]
        HaloGather._count(outgoing)
        state.requests = self.comm.start_exchange(outgoing, buffers)
        state.keep = outgoing
        state.received = [
            (span, buf) for (_, span), (_, buf) in zip(plan.sends(), buffers, strict=True)
        ]
        own = self._own()
        gx = gathered(own) if own[1] > own[0] else xp.zeros(shape, dtype=dtype)
        return chainer.Variable(gx), chainer.Variable(xp.zeros((0,), dtype=np.float32))


def interior(
    out: Span, own: Span, full: int, ksize: int, stride: int, pad: int, dilate: int
) -> Span:
    """The output rows of ``out`` whose windows read only rows of ``own`` (or padding next to
    it, at a true image border)."""
    extent = dilate * (ksize - 1) + 1
    lo = own[0] if own[0] > 0 else -(10**12)
    hi = own[1] if own[1] < full else 10**12
    first = max(out[0], -((-(lo + pad)) // stride) if lo > -(10**12) else out[0])
    last = min(out[1], (hi + pad - extent) // stride + 1 if hi < 10**12 else out[1])
    return (first, max(first, last))


def halo_edges(
    comm: CommunicatorBase, x: Any, plan: HaloPlan, spans: tuple[Span, ...], between: Any
) -> tuple[Any, tuple[chainer.Variable, ...]]:
    """Post the exchange, run ``between()`` (the interior), wait; return its result and the
    input rows of each of ``spans``."""
    state = _Exchange()
    token = HaloStart(comm, plan, state).apply((x,))[0]
    middle = between()
    edges = HaloFinish(comm, plan, state, spans).apply((x, token))
    return middle, tuple(edges)


__all__ = ["HaloFinish", "HaloStart", "halo_edges", "interior"]
