"""Tie a delegate variable into the graph so that backward reaches the ``send`` it stands for.

``send`` has no real output (the data left for another rank), so it returns a zero-size
*delegate variable*. Unless the delegate is part of the graph backward walks, the send's backward
(which receives the gradient from the peer) never runs and the peer hangs waiting to deliver it.
``pseudo_connect(delegate, *xs)`` returns ``xs`` unchanged but makes them depend on the delegate:
backward passes their gradients straight through and gives the delegate a zero gradient, which
wakes the send's backward.
"""

from __future__ import annotations

from typing import Any

import chainer
import numpy as np
from chainer import backend


class PseudoConnect(chainer.FunctionNode):
    """Identity on ``inputs[1:]``; input 0 (the delegate) only carries the graph."""

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        delegate = inputs[0]
        self.delegate_meta = (delegate.shape, delegate.dtype)
        self.xp = backend.get_array_module(delegate)
        return tuple(inputs[1:])

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        shape, dtype = self.delegate_meta
        return (chainer.Variable(self.xp.zeros(shape, dtype=dtype)), *grad_outputs)


def pseudo_connect(
    delegate_variable: chainer.Variable | None, *actual_variables: Any
) -> tuple[chainer.Variable, ...]:
    """Return ``actual_variables`` (as a tuple, like ChainerMN) connected to ``delegate_variable``.

    A ``None`` delegate is allowed (nothing to connect); the variables still come back as new
    graph nodes so callers need not special-case it.
    """
    if not actual_variables:
        raise ValueError("pseudo_connect needs at least one actual variable")
    if delegate_variable is None:
        arrays = [v.array if isinstance(v, chainer.Variable) else v for v in actual_variables]
        xp = backend.get_array_module(*arrays)
        delegate_variable = chainer.Variable(xp.empty((0,), dtype=np.float32))
    result: tuple[chainer.Variable, ...] = PseudoConnect().apply(
        (delegate_variable, *actual_variables)
    )
    return result
