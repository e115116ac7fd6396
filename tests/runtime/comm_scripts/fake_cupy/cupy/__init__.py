"""A stand-in for CuPy on machines without a GPU: device arrays that live in host memory.

Only what the communicators touch on a CuPy array exists here (``get``, ``device``, item
assignment, ``asarray``, ``zeros_like``), so tests can check that device arrays are staged through
the host and come back as device arrays. Every transfer is counted in ``TRANSFERS``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

TRANSFERS = {"download": 0, "upload": 0}


class ndarray:  # noqa: N801 - CuPy's name
    def __init__(self, data: np.ndarray) -> None:
        self._data = np.array(data, copy=True)

    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    size = property(lambda self: self._data.size)
    ndim = property(lambda self: self._data.ndim)

    @property
    def device(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def get(self) -> np.ndarray:
        TRANSFERS["download"] += 1
        return self._data.copy()

    def __setitem__(self, key: Any, value: Any) -> None:
        self._data[key] = value._data if isinstance(value, ndarray) else value

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("implicit conversion of a (fake) CuPy array to numpy")


def asarray(x: Any) -> ndarray:
    if isinstance(x, ndarray):
        return x
    TRANSFERS["upload"] += 1
    return ndarray(np.asarray(x))


def zeros_like(x: ndarray) -> ndarray:
    return ndarray(np.zeros(x.shape, x.dtype))


class _Runtime:
    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - CuPy's name
        return 0


class cuda:  # noqa: N801 - CuPy's name
    runtime = _Runtime
