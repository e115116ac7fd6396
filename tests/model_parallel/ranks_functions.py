"""Rank script: every differentiable collective and send/recv against one process doing it all.

Each rank builds every rank's inputs from a shared seed, runs the distributed function, and
compares its forward result and its input gradients with a single-process Chainer graph whose
loss is the sum of every rank's loss (the objective the distributed backward differentiates).
Prints ``PASS <name>`` per check (tests/support/rank_checks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chainer
import chainer.functions as F
import numpy as np

from mnify.runtime import functions as mnf
from tests.support.rank_checks import assert_close, make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size
V = chainer.Variable


def data(seed: int, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    return np.random.RandomState(seed).uniform(-1, 1, shape).astype(dtype)


def weighted(y: chainer.Variable, w: np.ndarray) -> chainer.Variable:
    return F.sum(y * w)


def reference_grads(
    inputs: list[np.ndarray], total_loss: Callable[[list[chainer.Variable]], chainer.Variable]
) -> list[np.ndarray]:
    """Gradients of ``total_loss`` w.r.t. every input, in one process."""
    vs = [V(x.copy()) for x in inputs]
    total_loss(vs).backward()
    return [v.grad for v in vs]


# ---------------------------------------------------------------- allgather (shapes differ)
for dtype, tol in ((np.float32, 1e-5), (np.float16, 1e-2)):
    xs = [data(10 + k, (k + 1, 3), dtype) for k in range(size)]
    ws = [[data(100 * r + k, (k + 1, 3), dtype) for k in range(size)] for r in range(size)]
    x = V(xs[rank].copy())
    ys = mnf.allgather(comm, x)
    assert len(ys) == size
    for k in range(size):
        assert_close(f"allgather[{dtype.__name__}] forward {k}", ys[k].array, xs[k], tol, tol)
    sum(weighted(ys[k], ws[rank][k]) for k in range(size)).backward()
    want = reference_grads(
        xs,
        lambda v, ws=ws: sum(weighted(v[k], ws[r][k]) for r in range(size) for k in range(size)),
    )
    assert_close(f"allgather[{dtype.__name__}] grad", x.grad, want[rank], tol, tol)
    passed(f"allgather_{dtype.__name__}")

# each rank uses only one of the gathered outputs: the others' gradients are None here
xs = [data(20 + k, (2, 2)) for k in range(size)]
x = V(xs[rank].copy())
ys = mnf.allgather(comm, x)
weighted(ys[(rank + 1) % size], xs[rank]).backward()
want = reference_grads(xs, lambda v: sum(weighted(v[(r + 1) % size], xs[r]) for r in range(size)))
assert_close("allgather unused outputs grad", x.grad, want[rank])
passed("allgather_unused_outputs")

# ---------------------------------------------------------------- alltoall (shapes differ)
# rank r sends block (r, k) shaped (r + k + 1, 2) to rank k
blocks = [[data(1000 + 10 * r + k, (r + k + 1, 2)) for k in range(size)] for r in range(size)]
ws = [[data(2000 + 10 * r + k, (k + r + 1, 2)) for k in range(size)] for r in range(size)]
mine = [V(b.copy()) for b in blocks[rank]]
ys = mnf.alltoall(comm, mine)
for k in range(size):
    assert_close(f"alltoall forward {k}", ys[k].array, blocks[k][rank])
sum(weighted(ys[k], ws[rank][k]) for k in range(size)).backward()
flat = [b for row in blocks for b in row]
want = reference_grads(
    flat,
    lambda v: sum(weighted(v[k * size + r], ws[r][k]) for r in range(size) for k in range(size)),
)
for k in range(size):
    assert_close(f"alltoall grad {k}", mine[k].grad, want[rank * size + k])
passed("alltoall")

# ---------------------------------------------------------------- bcast from the last rank
root = size - 1
x0 = data(30, (3, 4))
ws = [data(300 + r, (3, 4)) for r in range(size)]
xv = V(x0.copy()) if rank == root else None
y = mnf.bcast(comm, xv, root=root)
assert_close("bcast forward", y.array, x0)
weighted(y, ws[rank]).backward()
if rank == root:
    assert xv is not None
    want = reference_grads([x0], lambda v: sum(weighted(v[0], ws[r]) for r in range(size)))
    assert_close("bcast grad at root", xv.grad, want[0])
passed("bcast")

# ---------------------------------------------------------------- gather to rank 1 % size
root = 1 % size
xs = [data(40 + k, (k + 2,)) for k in range(size)]
ws = [data(400 + k, (k + 2,)) for k in range(size)]
x = V(xs[rank].copy())
out = mnf.gather(comm, x, root=root)
if rank == root:
    assert isinstance(out, tuple) and len(out) == size
    for k in range(size):
        assert_close(f"gather forward {k}", out[k].array, xs[k])
    sum(weighted(out[k], ws[k]) for k in range(size)).backward()
else:
    assert isinstance(out, chainer.Variable) and out.size == 0
    out.backward()  # the delegate: takes part in the scatter of gradients
want = reference_grads(xs, lambda v: sum(weighted(v[k], ws[k]) for k in range(size)))
assert_close("gather grad", x.grad, want[rank])
passed("gather")

# ---------------------------------------------------------------- scatter from rank 0
xs = [data(50 + k, (2, k + 1)) for k in range(size)]
ws = [data(500 + k, (2, k + 1)) for k in range(size)]
mine = [V(a.copy()) for a in xs] if rank == 0 else None
y = mnf.scatter(comm, mine, root=0)
assert_close("scatter forward", y.array, xs[rank])
weighted(y, ws[rank]).backward()
if rank == 0:
    assert mine is not None
    want = reference_grads(xs, lambda v: sum(weighted(v[k], ws[k]) for k in range(size)))
    for k in range(size):
        assert_close(f"scatter grad {k}", mine[k].grad, want[k])
passed("scatter")

# ---------------------------------------------------------------- allreduce sum / mean
for op in ("sum", "mean"):
    xs = [data(60 + k, (3, 2)) for k in range(size)]
    ws = [data(600 + k, (3, 2)) for k in range(size)]
    x = V(xs[rank].copy())
    y = mnf.allreduce(comm, x, op=op)
    scale = 1.0 if op == "sum" else 1.0 / size
    assert_close(f"allreduce {op} forward", y.array, (sum(xs) * np.float32(scale)))
    weighted(y, ws[rank]).backward()

    def total(
        v: list[chainer.Variable], scale: float = scale, ws: list[np.ndarray] = ws
    ) -> chainer.Variable:
        reduced = sum(v[1:], v[0]) * scale
        return sum(weighted(reduced, ws[r]) for r in range(size))

    assert_close(f"allreduce {op} grad", x.grad, reference_grads(xs, total)[rank])
    passed(f"allreduce_{op}")

# ---------------------------------------------------------------- send/recv pipeline 0 -> ... -> n-1
# rank 0: h0 = x * 2, sends (h0, x16) ; middle ranks: h = tanh(h_in) * w_r ; last: loss
x0 = data(70, (4, 3))
x16 = data(71, (2,), np.float16)
ws = [data(700 + r, (4, 3)) for r in range(size)]


def half_loss(v16: chainer.Variable) -> chainer.Variable:
    return F.sum(F.cast(v16 * v16, np.float32))


def pipeline(v: chainer.Variable, v16: chainer.Variable) -> chainer.Variable:
    h = v * 2
    for r in range(1, size - 1):
        h = F.tanh(h) * ws[r]
    return weighted(h, ws[size - 1]) + half_loss(v16)


if rank == 0:
    x = V(x0.copy())
    xh = V(x16.copy())
    delegate = mnf.send((x * 2, xh), comm, rank=1)
    assert delegate.size == 0
    delegate.backward()
    want = reference_grads([x0, x16.astype(np.float32)], lambda v: pipeline(v[0], v[1]))
    assert_close("send/recv grad", x.grad, want[0])
    assert xh.grad is not None and xh.grad.dtype == np.float16
    assert_close("send/recv fp16 grad", xh.grad, want[1].astype(np.float16), 1e-2, 1e-2)
else:
    got = mnf.recv(comm, rank - 1)
    assert isinstance(got, tuple) and len(got) == 2
    h, h16 = got
    assert h16.dtype == np.float16, h16.dtype
    if rank == size - 1:
        (weighted(h, ws[rank]) + half_loss(h16)).backward()
    else:
        mnf.send((F.tanh(h) * ws[rank], h16), comm, rank=rank + 1).backward()
passed("send_recv_pipeline")

# ---------------------------------------------------------------- a delegate threaded into recv
# rank 0 sends x to rank 1 and gets 3 * x back; its loss sum(y ** 2) must reach the first send.
if rank == 0:
    x = V(x0.copy())
    delegate = mnf.send(x, comm, rank=1, tag=7)
    y = mnf.recv(comm, 1, delegate_variable=delegate, tag=7)
    assert isinstance(y, chainer.Variable)
    F.sum(y * y).backward()
    assert_close("delegate round trip grad", x.grad, 18 * x0)
elif rank == 1:
    h = mnf.recv(comm, 0, tag=7, force_tuple=True)
    assert isinstance(h, tuple) and len(h) == 1
    mnf.send(h[0] * 3, comm, rank=0, tag=7).backward()
passed("delegate_round_trip")

# ---------------------------------------------------------------- pseudo_connect passes gradients
a = V(data(80, (3,)))
b = V(data(81, (3,)))
a2, b2 = mnf.pseudo_connect(None, a * 1, b * 1)
F.sum(a2 * b2).backward()
assert_close("pseudo_connect grad a", a.grad, b.array)
assert_close("pseudo_connect grad b", b.grad, a.array)
passed("pseudo_connect")
