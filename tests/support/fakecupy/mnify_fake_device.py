"""pytest plugin / import (``-p mnify_fake_device``): the CUDA kernels replaced by their numpy twins.

With the CuPy stand-in beside it on ``sys.path``, the gpu-marked tests run their own code on
CPU. Each twin is *queued* on the current stream, on the arrays' memory, as a kernel launch
is: it runs when the stream does, reads what stream order says it reads, and refuses arrays of
another device and -- as the ``__restrict__`` kernels would misbehave -- a bucket that
overlaps one of its arrays. Comparisons of a kernel with its twin are trivially equal
here, so this proves the tests and the code around the kernels, not the kernels (see
test_gpu_tests_on_stand_in.py; the kernels themselves: the nvcc and emulation tests).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import cupy  # type: ignore[import-not-found]
import numpy as np

from mnify.runtime.kernels import host

shim = types.ModuleType("mnify.runtime.kernels.device")


def _mem(x: Any) -> Any:
    return x._mem if isinstance(x, cupy.ndarray) else x


def _refuse_aliases(buf: Any, arrays: Sequence[Any]) -> None:
    for i, a in enumerate(arrays):
        if a.size and buf.size and np.shares_memory(_mem(a), _mem(buf)):
            raise RuntimeError(
                f"bucket copy: aliased __restrict__ pointers (array {i} overlaps the bucket)"
            )


def _queued(fn: Callable[..., None], *args: Any) -> None:
    arrays = [a for a in args if isinstance(a, cupy.ndarray)]
    for a in args:
        if isinstance(a, list):
            arrays += [x for x in a if isinstance(x, cupy.ndarray)]
    mems = [[_mem(x) for x in a] if isinstance(a, list) else _mem(a) for a in args]
    # as the CUDA module does: under the device of the arrays, on its current stream
    with cupy.cuda.Device(arrays[0].device.id if arrays else None):
        cupy._check_device(*arrays)
        cupy._enqueue(lambda: fn(*mems), touches=arrays)


def pack(arrays: Sequence[Any], out: Any, scale: float = 1.0) -> None:
    _refuse_aliases(out, arrays)
    _queued(host.pack, list(arrays), out, scale)


def unpack(buf: Any, arrays: Sequence[Any], scale: float = 1.0) -> None:
    _refuse_aliases(buf, arrays)
    _queued(host.unpack, buf, list(arrays), scale)


def scale(x: Any, factor: float) -> None:
    _queued(host.scale, x, factor)


def _sums(twin: Callable[..., tuple[np.ndarray, np.ndarray]], *xs: Any) -> tuple[Any, Any]:
    probe = twin(*[np.zeros(x.shape, x.dtype) for x in xs])
    outs = (cupy.empty(probe[0].shape, probe[0].dtype), cupy.empty(probe[1].shape, probe[1].dtype))

    def run(o0: np.ndarray, o1: np.ndarray, *ms: np.ndarray) -> None:
        o0[...], o1[...] = twin(*ms)

    _queued(run, *outs, *xs)
    return outs


def channel_sums(x: Any) -> tuple[Any, Any]:
    return _sums(host.channel_sums, x)


def bn_backward_sums(gy: Any, x_hat: Any) -> tuple[Any, Any]:
    return _sums(host.bn_backward_sums, gy, x_hat)


def gather_channels(flat: Any, counts: Sequence[int], out: Any) -> None:
    _queued(lambda f, o: host.gather_channels(f, counts, o), flat, out)


def split_channels(x: Any, counts: Sequence[int], out: Any) -> None:
    _queued(lambda a, o: host.split_channels(a, counts, o), x, out)


for _name in ("pack", "unpack", "scale", "channel_sums", "bn_backward_sums"):
    setattr(shim, _name, globals()[_name])
shim.gather_channels = gather_channels
shim.split_channels = split_channels
shim.prepare_pack = lambda arrays, out, scale=1.0: lambda: pack(arrays, out, scale)
shim.prepare_unpack = lambda buf, arrays, scale=1.0: lambda: unpack(buf, arrays, scale)
sys.modules["mnify.runtime.kernels.device"] = shim
