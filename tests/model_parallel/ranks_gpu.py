"""Rank script (GPU): model-parallel pieces on CuPy arrays, every rank on the node's device.

The ``naive`` communicator stages CuPy arrays through the host, so several ranks can share one
GPU (NCCL would refuse that). Checks that results and gradients stay CuPy arrays and equal the
same computation on one process: ParallelConvolution2D against Convolution2D, allgather's
backward, and a send/recv whose receiver has no delegate (the header says the data was CuPy).
Prints ``PASS <name>`` per check (tests/support/rank_checks).
"""

from __future__ import annotations

import chainer
import chainer.functions as F
import chainer.links as L
import cupy  # type: ignore[import-not-found]
import numpy as np

from mnify.runtime import functions as mnf
from mnify.runtime.links import ParallelConvolution2D
from tests.support.rank_checks import assert_close, make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size
device = chainer.get_device(f"@cupy:{comm.intra_rank % cupy.cuda.runtime.getDeviceCount()}")
device.use()
V = chainer.Variable


def data(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.RandomState(seed).uniform(-1, 1, shape).astype(np.float32)


def host(x: object) -> np.ndarray:
    assert isinstance(x, cupy.ndarray), f"expected a CuPy array, got {type(x)}"
    return cupy.asnumpy(x)


# ---------------------------------------------------------------- ParallelConvolution2D on the GPU
np.random.seed(5)
conv = L.Convolution2D(3, 5, 3, pad=1, initial_bias=data(1, (5,)))
par = ParallelConvolution2D(comm, 3, 5, 3, pad=1)
par.load_full_weights(conv.W.array, conv.b.array)
conv.to_device(device)
par.to_device(device)
x = data(2, (2, 3, 6, 6))
xr, xg = V(cupy.asarray(x)), V(cupy.asarray(x))
yr, yg = conv(xr), par(xg)
assert_close("gpu forward", host(yg.array), host(yr.array))
w = cupy.asarray(data(3, yr.shape))
conv.cleargrads()
par.cleargrads()
F.sum(yr * w).backward()
F.sum(yg * w).backward()
assert_close("gpu grad x", host(xg.grad), host(xr.grad))
assert_close("gpu grad W", host(par.W.grad), host(conv.W.grad)[par.local_slice()])
assert par.b is not None
assert_close("gpu grad b", host(par.b.grad), host(conv.b.grad)[par.local_slice()])
passed("gpu_parallel_convolution")

# ---------------------------------------------------------------- allgather on CuPy
xs = [data(10 + k, (k + 1, 2)) for k in range(size)]
xv = V(cupy.asarray(xs[rank]))
ys = mnf.allgather(comm, xv)
for k in range(size):
    assert_close(f"gpu allgather {k}", host(ys[k].array), xs[k])
F.sum(sum(F.sum(y) * (k + 1) for k, y in enumerate(ys))).backward()
assert_close("gpu allgather grad", host(xv.grad), np.full_like(xs[rank], size * (rank + 1)))
passed("gpu_allgather")

# ---------------------------------------------------------------- send/recv on CuPy, no delegate
if rank == 0:
    xv = V(cupy.asarray(data(20, (3,))))
    mnf.send(xv * 2, comm, rank=1).backward()
    assert_close("gpu send grad", host(xv.grad), np.full(3, 6, np.float32))
elif rank == 1:
    h = mnf.recv(comm, 0)
    assert isinstance(h, chainer.Variable)
    assert_close("gpu recv", host(h.array), data(20, (3,)) * 2)
    F.sum(h * 3).backward()
passed("gpu_send_recv")
