"""Rank script: gradient averaging overlapped with backward equals the sequential path.

Each check trains two copies of one model from the same start for 20 steps on this rank's own
batches: one with ``overlap=False`` (the communicator's ``multi_node_mean_grad`` after
backward), one with ``overlap=True`` (buckets started from backward by gradient taps, MPI
non-blocking reductions). Models have a parameter used twice (a shared Linear or convolution),
a parameter no forward uses, and small buckets (several per step). After 20 steps the
parameters are bit-identical on every rank on both paths, and the two paths agree bitwise on 2
ranks (a sum of two terms does not depend on order) and within 1e-6 relative on more.

Also: buckets really start during backward (counted), a branch used on some ranks only
(zero-filled there), two ``backward()`` calls before one ``update()`` (the sequential path by
design), a backward inside the loss function (falls back), and ``overlap=None``'s default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tests.support import fakecupy

if os.environ.get("MNIFY_TEST_COMM") == "pure_nccl":  # CuPy and NCCL stood in, on CPU
    fakecupy.use()

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import numpy as np  # noqa: E402

from mnify.runtime.optimizers import create_multi_node_optimizer  # noqa: E402
from tests.support.rank_checks import make_comm, passed  # noqa: E402

STEPS = 20
comm = make_comm()
rank, size = comm.rank, comm.size
comm.set_config("bucket_bytes", 512)  # several buckets per step, on both paths


class SharedMLP(chainer.Chain):
    """l2 is applied twice (a shared parameter); ``unused`` is never applied; ``head`` only
    where ``use_head`` says."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(6, 16)
            self.l2 = L.Linear(16, 16)
            self.l3 = L.Linear(16, 4)
            self.head = L.Linear(16, 4)
            self.unused = L.Linear(4, 4)

    def __call__(self, x: Any, use_head: bool = False) -> Any:
        h = F.tanh(self.l1(x))
        h = F.tanh(self.l2(h))
        h = F.tanh(self.l2(h))
        y = self.l3(h)
        return y + self.head(h) if use_head else y


class SharedCNN(chainer.Chain):
    """A convolution applied twice, then a linear classifier; ``unused`` never applied."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(2, 4, 3, pad=1)
            self.c2 = L.Convolution2D(4, 4, 3, pad=1)
            self.fc = L.Linear(4 * 6 * 6, 3)
            self.unused = L.Convolution2D(4, 4, 1)

    def __call__(self, x: Any, use_head: bool = False) -> Any:
        h = F.relu(self.c1(x))
        h = F.relu(self.c2(h))
        h = F.relu(self.c2(h))
        return self.fc(h)


def batches(shape: tuple[int, ...], seed: int) -> list[np.ndarray]:
    rng = np.random.RandomState(1000 * seed + rank)
    return [rng.randn(*shape).astype(np.float32) for _ in range(STEPS)]


def make(factory: Callable[[], chainer.Chain], overlap: bool | None) -> tuple[Any, Any]:
    np.random.seed(7 + rank)  # ranks start apart: the first update broadcasts rank 0's
    model = factory()
    opt = create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.05), comm, overlap=overlap
    )
    opt.setup(model)
    return model, opt


def train(
    factory: Callable[[], chainer.Chain],
    overlap: bool,
    data: list[np.ndarray],
    use_head: bool = False,
    two_backward: bool = False,
) -> tuple[dict[str, np.ndarray], Any]:
    model, opt = make(factory, overlap)
    for x in data:
        if two_backward:
            # gradients of two losses accumulate, then one update averages them (once)
            model.cleargrads()
            F.mean(model(x, use_head) ** 2).backward()
            F.mean(F.sin(model(x[::-1], use_head))).backward()
            opt.update()
        else:
            opt.update(lambda x=x: F.mean(model(x, use_head) ** 2))
    return {n: p.array.copy() for n, p in sorted(model.namedparams())}, opt


def same_on_every_rank(name: str, params: dict[str, np.ndarray]) -> None:
    everyone = comm.allgather_obj(params)
    for other in everyone[1:]:
        for key in params:
            if not np.array_equal(other[key], everyone[0][key]):
                raise AssertionError(f"{name}: {key} differs between ranks")


def paths_agree(name: str, plain: dict[str, np.ndarray], overlapped: dict[str, np.ndarray]) -> None:
    same_on_every_rank(name + " (sequential)", plain)
    same_on_every_rank(name + " (overlapped)", overlapped)
    for key, want in plain.items():
        got = overlapped[key]
        if size == 2:
            if not np.array_equal(got, want):
                diff = float(np.max(np.abs(got.astype(np.float64) - want)))
                raise AssertionError(f"{name}: {key} not bitwise equal (max abs diff {diff:g})")
        else:
            scale = max(float(np.max(np.abs(want))), 1e-30)
            rel = float(np.max(np.abs(got.astype(np.float64) - want))) / scale
            if rel > 1e-6:
                raise AssertionError(f"{name}: {key} relative difference {rel:g} > 1e-6")


def check_model(label: str, factory: Callable[[], chainer.Chain], shape: tuple[int, ...]) -> None:
    data = batches(shape, seed=len(label))
    plain, _ = train(factory, False, data)
    overlapped, opt = train(factory, True, data)
    paths_agree(label, plain, overlapped)
    stats = opt.overlap_stats
    assert stats.steps == STEPS, stats  # the first too: broadcast before its forward
    assert stats.fallbacks == 0, stats
    shared = [n for n, uses in stats.uses.items() if uses == 2]
    assert shared and all("2" in n for n in shared), stats.uses
    assert not any("unused" in n for n in stats.uses), stats.uses
    # started during backward, counted: every step after the first (which learns the order)
    # starts at least one bucket before backward returns
    assert stats.buckets > 2, stats
    assert stats.started_in_backward >= STEPS - 1, stats
    passed(label, comm)


check_model("MLP with a shared layer and an unused one, 20 steps", SharedMLP, (5, 6))
check_model("CNN with a shared convolution and an unused one, 20 steps", SharedCNN, (3, 2, 6, 6))

# a head used on rank 0 only: zero-filled on the others, the same buckets everywhere
data = batches((5, 6), seed=3)
use_head = rank == 0
model, opt = make(SharedMLP, True)
plain_model, plain_opt = make(SharedMLP, False)
for x in data:
    opt.update(lambda x=x: F.mean(model(x, use_head) ** 2))
    plain_opt.update(lambda x=x: F.mean(plain_model(x, use_head) ** 2))
paths_agree(
    "head used on some ranks",
    {n: p.array for n, p in sorted(plain_model.namedparams())},
    {n: p.array for n, p in sorted(model.namedparams())},
)
assert opt.overlap_stats.fallbacks == 0
passed("a parameter used on some ranks only is zero-filled on the others", comm)

# two backward() calls, one update(): gradients accumulate, the mean runs once, after both
plain, _ = train(SharedMLP, False, data, two_backward=True)
overlapped, opt = train(SharedMLP, True, data, two_backward=True)
paths_agree("two backward per update", plain, overlapped)
assert opt.overlap_stats.steps == 0  # update() without a loss function: sequential by design
passed("two backward calls per update average once, after the last", comm)


# a loss function that runs a backward of its own: that step falls back to the sequential path
def train_inner_backward(overlap: bool) -> tuple[dict[str, np.ndarray], Any]:
    model, opt = make(SharedMLP, overlap)
    for x in data[:6]:

        def lossfun(x: np.ndarray = x) -> Any:
            F.sum(model(x)).backward()  # its gradients are cleared before the update's own
            return F.mean(model(x) ** 2)

        opt.update(lossfun)
    return {n: p.array.copy() for n, p in sorted(model.namedparams())}, opt


plain, _ = train_inner_backward(False)
overlapped, opt = train_inner_backward(True)
paths_agree("backward inside the loss function", plain, overlapped)
assert opt.overlap_stats.fallbacks == 6 and opt.overlap_stats.steps == 0, opt.overlap_stats
passed("a backward inside the loss function falls back to the sequential path", comm)

default = create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
assert default.overlap == (comm.name == "pure_nccl"), (comm.name, default.overlap)
passed("overlap=None: on for pure_nccl only", comm)
