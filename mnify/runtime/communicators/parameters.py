"""Chainer's parameter protocol, as the communicators need it: a model's parameters in an order
every rank agrees on, and the gradients a mean-grad reduces. Duck-typed (``namedparams()``,
``.grad``, ``.data``), so the communicators never import Chainer."""

from __future__ import annotations

from typing import Any

from mnify.runtime.communicators import _arrays as arr


def named_params(model: Any) -> list[tuple[str, Any]]:
    """``model.namedparams()`` sorted by name, so every rank walks them in the same order."""
    return sorted(model.namedparams(), key=lambda item: item[0])


def grads_to_reduce(model: Any, zero_fill: bool) -> tuple[list[str], list[Any]]:
    """The names and ``.grad`` arrays of ``model`` that a mean-grad reduces, in rank-agreed order.

    ``zero_fill``: a parameter with data but no grad gets a zero grad (so every rank reduces the
    same arrays); otherwise it is skipped.
    """
    names, grads = [], []
    for name, param in named_params(model):
        if param.grad is None:
            if not zero_fill or getattr(param, "data", None) is None:
                continue
            param.grad = arr.zeros_like(param.data)
        names.append(name)
        grads.append(param.grad)
    return names, grads
