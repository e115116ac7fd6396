"""Rank script: the double-buffering schedule on CPU ranks, with CuPy/NCCL stood in.

tests/support/fakecupy stands in for CuPy and NCCL (its NCCL calls run over MPI), so the
pure_nccl communicator and ``double_buffering=True`` run here; the model stays on the host, so
pure_nccl averages its gradients on the MPI path. What is checked is the optimizer's schedule:
with the same batch every step, four updates apply the averaged gradient of rank 0's initial
parameters twice (steps 2 and 3, each one step late), and every rank ends identical.
"""

from __future__ import annotations

from tests.support import fakecupy

fakecupy.use()

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import mnify_fake_device  # noqa: E402, F401  (CUDA kernels -> numpy twins)
import numpy as np  # noqa: E402

from mnify.runtime.communicators import create_communicator  # noqa: E402
from mnify.runtime.optimizers import create_multi_node_optimizer  # noqa: E402
from tests.support.rank_checks import assert_close, passed  # noqa: E402

chainer.global_config.dtype = np.dtype(np.float64)
comm = create_communicator("pure_nccl")
rank, size = comm.rank, comm.size
assert comm.name == "pure_nccl"

np.random.seed(rank)  # different initialisations
model = L.Linear(4, 3)
x = np.random.RandomState(10 + rank).randn(5, 4)
start = comm.bcast_obj({name: p.array.copy() for name, p in model.namedparams()})

# each rank's gradient at rank 0's initial parameters, averaged
probe = L.Linear(4, 3)
for name, param in probe.namedparams():
    param.array[...] = start[name]
probe.cleargrads()
F.sum(probe(x) ** 2).backward()
grads = comm.allgather_obj({name: p.grad for name, p in probe.namedparams()})
mean_grad = {name: sum(g[name] for g in grads) / size for name in start}

lr = 0.05
opt = create_multi_node_optimizer(chainer.optimizers.SGD(lr=lr), comm, double_buffering=True)
opt.setup(model)
for _ in range(4):
    opt.update(lambda: F.sum(model(x) ** 2))
opt.wait()
assert opt.t == 2, opt.t
for name, param in model.namedparams():
    assert_close(f"{name}", param.array, start[name] - 2 * lr * mean_grad[name], 1e-10)
everyone = comm.allgather_obj({name: p.array for name, p in model.namedparams()})
assert all(np.array_equal(e[n], everyone[0][n]) for e in everyone for n in start)
passed("double buffering applies averaged gradients one step late", comm)
