"""Moving evaluation results between ranks: device arrays and Variables travel as host arrays.

What one rank computed on its GPU is pickled to another rank whose GPU is a different one, so
nothing device-bound may be pickled as it is: a CuPy (or ChainerX) array becomes a
:class:`DeviceArray` holding its host copy, a ``chainer.Variable`` a :class:`VariableBox`; on
the receiving rank :func:`from_wire` puts them back on *that* rank's current device.
:func:`wire_safe` says whether a value is made only of things that travel this way (a method
that returns a Link or a generator does not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import chainer
import numpy as np

_SCALARS = (type(None), bool, int, float, complex, str, bytes, np.generic)


@dataclass
class DeviceArray:
    """A CuPy/ChainerX array on the wire: its host copy and which kind of device it was on."""

    host: np.ndarray
    kind: str  # "cupy" | "chainerx"


@dataclass
class VariableBox:
    """A ``chainer.Variable`` on the wire (its data, on the host if it was on a device)."""

    data: Any
    requires_grad: bool


def is_device_array(x: Any) -> bool:
    """A CuPy or ChainerX array (never a numpy one)."""
    if isinstance(x, np.ndarray):
        return False
    return isinstance(x, chainer.backends.cuda.ndarray) or _is_chainerx(x)


def _is_chainerx(x: Any) -> bool:
    try:
        import chainerx
    except ImportError:  # pragma: no cover - chainerx always imports with Chainer 7
        return False
    return isinstance(x, chainerx.ndarray)


def host_array(x: Any) -> np.ndarray:
    """``x`` (numpy, CuPy or ChainerX) as a numpy array."""
    if isinstance(x, np.ndarray):
        return x
    return np.asarray(chainer.backend.CpuDevice().send(x))


def _map(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` with ``leaf`` applied inside lists, tuples (named ones too) and dicts."""
    if isinstance(obj, list):
        return [_map(x, leaf) for x in obj]
    if isinstance(obj, tuple):
        items = [_map(x, leaf) for x in obj]
        return type(obj)._make(items) if hasattr(obj, "_make") else tuple(items)
    if isinstance(obj, dict):
        return {k: _map(v, leaf) for k, v in obj.items()}
    return leaf(obj)


def _to_wire_leaf(x: Any) -> Any:
    if isinstance(x, chainer.Variable):
        data = x.array
        return VariableBox(_to_wire_leaf(data) if data is not None else None, x.requires_grad)
    if is_device_array(x):
        return DeviceArray(host_array(x), "cupy" if not _is_chainerx(x) else "chainerx")
    return x


def to_wire(obj: Any) -> Any:
    """``obj`` ready to pickle to another rank (see the module docstring)."""
    return _map(obj, _to_wire_leaf)


def _on_current_device(boxed: DeviceArray) -> Any:
    if boxed.kind == "chainerx":
        import chainerx

        return chainerx.array(boxed.host, device=chainerx.get_default_device())
    return chainer.backends.cuda.to_gpu(boxed.host)  # the current device


def _from_wire_leaf(x: Any) -> Any:
    if isinstance(x, VariableBox):
        data = _from_wire_leaf(x.data) if x.data is not None else None
        return chainer.Variable(data, requires_grad=x.requires_grad)
    if isinstance(x, DeviceArray):
        return _on_current_device(x)
    return x


def from_wire(obj: Any) -> Any:
    """What :func:`to_wire` made, with device arrays back on this rank's current device."""
    return _map(obj, _from_wire_leaf)


def to_host(obj: Any) -> Any:
    """``obj`` with Variables and device arrays replaced by numpy arrays (reported values)."""

    def leaf(x: Any) -> Any:
        if isinstance(x, chainer.Variable):
            x = x.array
        return host_array(x) if is_device_array(x) else x

    return _map(obj, leaf)


def wire_safe(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` is made only of arrays, Variables, scalars, strings and containers of
    them: what can be recorded on one rank and handed out again on another."""
    if depth > 32:
        return False
    if isinstance(obj, (list, tuple)):
        return all(wire_safe(x, depth + 1) for x in obj)
    if isinstance(obj, dict):
        return all(isinstance(k, _SCALARS) and wire_safe(v, depth + 1) for k, v in obj.items())
    if isinstance(obj, chainer.Variable):
        return True
    if isinstance(obj, np.ndarray):
        return not obj.dtype.hasobject
    return isinstance(obj, _SCALARS) or is_device_array(obj)
