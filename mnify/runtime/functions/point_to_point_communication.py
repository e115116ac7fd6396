"""Differentiable send/recv between two ranks, for layer-wise model parallelism.

``send(x, comm, rank)`` ships ``x`` (one variable or a tuple) to ``rank`` and returns a zero-size
*delegate variable*; ``recv(comm, rank)`` returns what arrived. In backward the receiver sends the
gradient back and the sender's delegate receives it, so the delegate must be reachable from
whatever this rank calls ``backward()`` on: call ``delegate.backward()`` when it is the last thing
the rank computes, or pass it to the next ``recv(..., delegate_variable=...)`` or
:func:`~mnify.runtime.functions.pseudo_connect`.

Wire protocol (forward, sender -> receiver, on ``tag``): one object ``(n, on_gpu)`` (how many
arrays, and whether they were CuPy arrays: the receiver then puts them on its current device), then
``n`` arrays. Backward (receiver -> sender, same tag): exactly ``n`` gradient arrays, zeros for
outputs the receiver did not use, so the sender never waits for a message that is not coming.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np

from mnify.runtime.functions.collective_communication import (
    array_module,
    grad_or_zeros,
    like_module,
    make_anchor,
)

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


def _is_cupy(xp: Any) -> bool:
    return getattr(xp, "__name__", "") == "cupy"


def _cupy() -> Any:
    import cupy  # type: ignore[import-not-found]

    return cupy


class Send(chainer.FunctionNode):
    """Inputs: the arrays to send, then an anchor. Output: the zero-size delegate."""

    def __init__(self, comm: CommunicatorBase, peer: int, tag: int) -> None:
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.in_meta: list[tuple[tuple[int, ...], Any]] = []
        self.xp: Any = np

    @property
    def label(self) -> str:
        return f"Send (to rank {self.peer}, tag {self.tag})"

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        xs = inputs[:-1]
        self.xp = array_module(*xs)
        self.in_meta = [(tuple(x.shape), x.dtype) for x in xs]
        self.comm.send_obj((len(xs), _is_cupy(self.xp)), self.peer, tag=self.tag)
        for x in xs:
            self.comm.send(self.xp.ascontiguousarray(x), self.peer, tag=self.tag)
        return (self.xp.empty((0,), dtype=np.float32),)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        grads = []
        for shape, dtype in self.in_meta:
            g = like_module(self.comm.recv(self.peer, tag=self.tag), self.xp)
            grads.append(chainer.Variable(g.astype(dtype, copy=False).reshape(shape)))
        return (*grads, None)


class Recv(chainer.FunctionNode):
    """Input: the previous delegate (or an anchor). Outputs: the arrays the peer sent."""

    def __init__(self, comm: CommunicatorBase, peer: int, tag: int, xp: Any) -> None:
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.xp = xp
        self.out_meta: list[tuple[tuple[int, ...], Any]] = []
        self.in_meta: list[tuple[tuple[int, ...], Any]] = []

    @property
    def label(self) -> str:
        return f"Recv (from rank {self.peer}, tag {self.tag})"

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        self.in_meta = [(tuple(a.shape), a.dtype) for a in inputs]
        count, on_gpu = self.comm.recv_obj(self.peer, tag=self.tag)
        arrays = [self.comm.recv(self.peer, tag=self.tag) for _ in range(int(count))]
        if self.xp is None:
            self.xp = _cupy() if on_gpu else array_module(*arrays)
        outs = tuple(like_module(a, self.xp) for a in arrays)
        self.out_meta = [(tuple(a.shape), a.dtype) for a in outs]
        return outs

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        for g, (shape, dtype) in zip(grad_outputs, self.out_meta, strict=True):
            gy = grad_or_zeros(g, shape, dtype, self.xp)
            self.comm.send(self.xp.ascontiguousarray(gy), self.peer, tag=self.tag)
        # The delegate (or anchor) only carried the graph: its gradient is zero.
        return tuple(
            chainer.Variable(self.xp.zeros(shape, dtype=dtype)) for shape, dtype in self.in_meta
        )


def send(
    x: Any | Sequence[Any], communicator: CommunicatorBase, rank: int, tag: int = 0
) -> chainer.Variable:
    """Send ``x`` (a variable/array or a tuple/list of them) to ``rank``; return the delegate.

    The delegate is a zero-size variable holding only the graph. Backward through it receives
    the gradients of ``x`` from ``rank``.
    """
    if rank == communicator.rank:
        raise ValueError(f"send: rank {rank} is this rank; sending to itself would deadlock")
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    if not xs:
        raise ValueError("send: nothing to send")
    anchor = make_anchor(array_module(*xs))
    delegate: chainer.Variable = Send(communicator, rank, tag).apply((*xs, anchor))[0]
    delegate.name = "delegate_variable"
    return delegate


def recv(
    communicator: CommunicatorBase,
    rank: int,
    delegate_variable: chainer.Variable | None = None,
    tag: int = 0,
    force_tuple: bool = False,
    *,
    xp: Any = None,
) -> chainer.Variable | tuple[chainer.Variable, ...]:
    """Receive what ``rank`` sent; backward sends the gradients back to it.

    ``delegate_variable`` (from an earlier :func:`send` on this rank) is threaded through, so
    backward from what this returns also reaches that send. One array comes back as a variable
    unless ``force_tuple``; several come back as a tuple. ``xp`` (numpy or cupy) picks where the
    result lives (default: the delegate's array module, else where the sender's arrays were).
    """
    if rank == communicator.rank:
        raise ValueError(f"recv: rank {rank} is this rank; receiving from itself would deadlock")
    if delegate_variable is None:
        link = make_anchor(xp or np)
        module = xp
    else:
        delegate_variable.name = "delegate_variable"
        link = delegate_variable
        module = xp or array_module(delegate_variable)
    outs: tuple[chainer.Variable, ...] = Recv(communicator, rank, tag, module).apply((link,))
    if len(outs) == 1 and not force_tuple:
        return outs[0]
    return tuple(outs)
