"""Chainer 7 bugs that only a batch of zero examples hits, fixed where the global-batch iterator
can hand one out (a last ``repeat=False`` batch smaller than the number of ranks).

A rank with an empty share still runs the loss and its backward, so that it takes part in every
collective of the step (MultiNodeBatchNormalization's, the gradient mean). Chainer 7.8's
``softmax_cross_entropy`` backward returns one gradient too many for an empty batch (its empty
case returns ``(gx, None)`` and the caller appends another ``None``), so backward raises. The fix
drops the extra ``None`` for empty inputs only; every non-empty batch runs Chainer's code as is.
"""

from __future__ import annotations

from typing import Any

_applied = False


def apply() -> None:
    """Install the fixes once (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True
    from chainer.functions.loss import softmax_cross_entropy as sce

    grad = getattr(sce, "_SoftmaxCrossEntropyGrad_NoDoubleBackprop", None)
    if grad is None:  # another Chainer version: nothing known to fix
        return
    original = grad.forward

    def forward(self: Any, inputs: Any) -> Any:
        outputs = original(self, inputs)
        if len(outputs) == 2 and outputs[1] is None and getattr(outputs[0], "size", 1) == 0:
            return outputs[:1]
        return outputs

    grad.forward = forward
