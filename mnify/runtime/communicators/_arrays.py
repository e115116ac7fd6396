"""Arrays as MPI sees them: host staging for CuPy arrays and the dtypes MPI can reduce.

Communicators talk MPI on host (numpy) memory. A CuPy array is copied to the host before a
collective and the result copied back, so callers get results in their own array module. CuPy is
imported only when a CuPy array actually shows up, never at module import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

OPS: dict[str, MPI.Op] = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}


def mpi_op(op: str) -> MPI.Op:
    """``'sum'`` -> ``MPI.SUM``; a clear error for names the contract does not have."""
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"unknown reduction {op!r}; expected one of {sorted(OPS)}") from None


def is_cupy(x: Any) -> bool:
    return type(x).__module__.split(".", 1)[0] == "cupy"


def array_module(x: Any) -> Any:
    """numpy for numpy arrays, cupy for CuPy arrays (imported lazily)."""
    if is_cupy(x):
        import cupy  # type: ignore[import-not-found]

        return cupy
    return np


def to_host(x: Any) -> np.ndarray:
    """A numpy view or copy of ``x``: numpy arrays (and scalars, lists) as they are, CuPy downloaded."""
    if is_cupy(x):
        return np.asarray(x.get())
    return np.asarray(x)


def like(host: np.ndarray, template: Any) -> Any:
    """``host`` in ``template``'s array module: unchanged for numpy, uploaded for CuPy."""
    if is_cupy(template):
        import cupy

        with template.device:
            return cupy.asarray(host)
    return host


def write_back(target: Any, host: np.ndarray) -> None:
    """Copy ``host`` into ``target`` in place (numpy or CuPy)."""
    if is_cupy(target):
        target[...] = like(host, target)
    elif target is not host:
        np.copyto(target, host, casting="unsafe")


def zeros_like(x: Any) -> Any:
    return array_module(x).zeros_like(x)


@functools.cache
def mpi_can_reduce(dtype: np.dtype[Any]) -> bool:
    """Whether this MPI library sums ``dtype`` natively (float16 is a vendor extension).

    Open MPI 5 maps numpy's float16 to ``MPI_SHORT_FLOAT`` and sums it; other libraries may not.
    Probed once per dtype on ``COMM_SELF``, where an unsupported type is an error, not a hang.
    """
    try:
        x = np.ones(2, dtype=dtype)
        y = np.empty_like(x)
        MPI.COMM_SELF.Allreduce(x, y, MPI.SUM)
        return bool(np.all(y == x))
    except Exception:
        return False


def reduction_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype a buffer of ``dtype`` is reduced in on the wire: itself, or float32 for halves
    (and other types) this MPI cannot reduce."""
    dtype = np.dtype(dtype)
    if mpi_can_reduce(dtype):
        return dtype
    if dtype.kind == "f" and dtype.itemsize < 4:
        return np.dtype(np.float32)
    raise TypeError(f"MPI cannot reduce arrays of dtype {dtype}")


def contiguous_views(
    arrays: list[np.ndarray],
) -> tuple[list[np.ndarray], Callable[[], None]]:
    """1-D views of ``arrays`` to read and write through, plus a function that writes back the
    temporary copies made for non-contiguous arrays (a no-op when all are contiguous)."""
    flats: list[np.ndarray] = []
    pending: list[tuple[np.ndarray, np.ndarray]] = []
    for a in arrays:
        if a.flags.c_contiguous:
            flats.append(a.reshape(-1))
        else:
            tmp = np.ascontiguousarray(a)
            pending.append((a, tmp))
            flats.append(tmp.reshape(-1))

    def flush() -> None:
        for original, tmp in pending:
            np.copyto(original, tmp)

    return flats, flush
