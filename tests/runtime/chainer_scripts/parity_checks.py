"""Rank script: N ranks training data parallel == one process training on the concatenated batch.

Each rank starts from its own random initialisation (seed 100 + rank) and trains a few steps on
its slice of every global batch with ``create_multi_node_optimizer`` and
MultiNodeBatchNormalization. The reference, computed on every rank, is one process starting
from rank 0's initialisation and training with plain BatchNormalization on the concatenated
batch. Parameters and running statistics must agree within 1e-5 relative, and be identical
on every rank.

Gradient semantics (documented in mnify.runtime.optimizers): ranks average their gradients
with equal weight, so the reference loss is the mean over ranks of each rank's batch-mean
loss. A second variant scales each rank's loss by ``local_batch * size / global_batch`` and
matches the plain mean over the global batch.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn
from mnify.runtime.links.create_mnbn_model import create_mnbn_model
from tests.support.rank_checks import assert_close, make_comm, passed

chainer.global_config.dtype = np.dtype(np.float64)  # exact arithmetic: parity errors ~1e-12
comm = make_comm()
rank, size = comm.rank, comm.size
if os.environ.get("MNIFY_TEST_RANKS_PER_HOST"):  # the fake hosts really took effect
    per_host = int(os.environ["MNIFY_TEST_RANKS_PER_HOST"])
    assert comm.inter_size == -(-size // per_host), (comm.inter_size, comm.intra_size)
    assert comm.name == os.environ["MNIFY_TEST_COMM"], comm.name

BnFactory = Callable[[int], chainer.Link]


def plain_bn(channels: int) -> chainer.Link:
    return L.BatchNormalization(channels, decay=0.8)


def multi_node_bn(channels: int) -> chainer.Link:
    return mn.links.MultiNodeBatchNormalization(channels, comm, decay=0.8)


class MLP(chainer.Chain):
    """Linear -> BN -> relu -> Linear; the first layer may be lazily initialised."""

    def __init__(self, bn: BnFactory, lazy: bool) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None if lazy else 5, 6)
            self.bn = bn(6)
            self.l2 = L.Linear(6, 3)

    def forward(self, x: Any, owner: int = 0) -> Any:
        return self.l2(F.relu(self.bn(self.l1(x))))


class CNN(chainer.Chain):
    """Conv -> BN -> relu -> Conv -> BN -> relu -> Linear over 2x4x4 inputs."""

    def __init__(self, bn: BnFactory) -> None:
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(2, 4, 3, pad=1)
            self.b1 = bn(4)
            self.c2 = L.Convolution2D(4, 3, 3, pad=1)
            self.b2 = bn(3)
            self.fc = L.Linear(3 * 4 * 4, 3)

    def forward(self, x: Any, owner: int = 0) -> Any:
        h = F.relu(self.b1(self.c1(x)))
        return self.fc(F.relu(self.b2(self.c2(h))))


class TwoHeads(chainer.Chain):
    """A shared trunk and two heads; the examples of even ranks use head a, odd ranks head b.

    On each rank one head gets no gradient at all: ``zero_fill`` must average zeros for it.
    """

    def __init__(self, bn: BnFactory, lazy: bool = False) -> None:
        super().__init__()
        with self.init_scope():
            self.trunk = L.Linear(5, 4)
            self.bn = bn(4)
            self.a = L.Linear(4, 3)
            self.b = L.Linear(4, 3)

    def forward(self, x: Any, owner: int = 0) -> Any:
        h = F.relu(self.bn(self.trunk(x)))
        return self.a(h) if owner % 2 == 0 else self.b(h)


def make_batches(
    steps: int, counts: list[int], input_shape: tuple[int, ...], dtype: Any = np.float64
) -> list[Any]:
    """Global batches (same on every rank): inputs, labels, and each rank's slice of them."""
    rng = np.random.RandomState(7)
    bounds = np.cumsum([0, *counts])
    slices = [slice(int(bounds[r]), int(bounds[r + 1])) for r in range(size)]
    out = []
    for _ in range(steps):
        x = rng.randn(sum(counts), *input_shape).astype(dtype)
        t = rng.randint(0, 3, sum(counts)).astype(np.int32)
        out.append((x, t, slices))
    return out


def persistent_arrays(model: chainer.Link) -> dict[str, Any]:
    """Parameters and running statistics by path, as host arrays."""
    found = {name: np.asarray(p.array) for name, p in model.namedparams()}
    for path, link in model.namedlinks():
        for name in ("avg_mean", "avg_var"):
            if hasattr(link, name):
                found[f"{path}/{name}"] = np.asarray(getattr(link, name))
    return found


def train_reference(
    build: Callable[[], chainer.Link], batches: list[Any], per_example: bool, seed: int
) -> chainer.Link:
    np.random.seed(seed)
    model = build()
    opt = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    opt.setup(model)
    for x, t, slices in batches:

        def loss_fn(x: Any = x, t: Any = t, slices: list[slice] = slices) -> Any:
            if isinstance(model, TwoHeads):  # one trunk forward, each rank's examples their head
                h = F.relu(model.bn(model.trunk(x)))
                ys = [(model.a if r % 2 == 0 else model.b)(h[s]) for r, s in enumerate(slices)]
            else:
                y = model(x)  # one forward: batch norm sees the concatenated batch
                ys = [y[s] for s in slices]
            if per_example:
                return F.softmax_cross_entropy(F.concat(ys, axis=0), t)
            per_rank = [
                F.softmax_cross_entropy(y_r, t[s]) for y_r, s in zip(ys, slices, strict=True)
            ]
            return sum(per_rank) / len(per_rank)

        np.random.seed(seed)  # lazy parameters draw the same numbers as rank 0
        opt.update(loss_fn)
    return model


def train_ranks(
    build: Callable[[], chainer.Link], batches: list[Any], per_example: bool, seed: int
) -> tuple[chainer.Link, Any]:
    np.random.seed(seed + rank)  # every rank starts from its own initialisation
    model = build()
    opt = mn.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9), comm)
    opt.setup(model)
    for x, t, slices in batches:
        mine = slices[rank]
        weight = (mine.stop - mine.start) * size / len(t) if per_example else 1.0

        def loss_fn(x: Any = x[mine], t: Any = t[mine], weight: float = weight) -> Any:
            return F.softmax_cross_entropy(model(x, rank), t) * weight

        np.random.seed(seed + rank)
        opt.update(loss_fn)
    return model, opt


def check_parity(
    name: str,
    build_mn: Callable[[], chainer.Link],
    build_ref: Callable[[], chainer.Link],
    counts: list[int],
    input_shape: tuple[int, ...],
    per_example: bool = False,
    steps: int = 3,
    dtype: Any = np.float64,
) -> None:
    batches = make_batches(steps, counts, input_shape, dtype)
    with chainer.using_config("dtype", np.dtype(dtype)):
        model, opt = train_ranks(build_mn, batches, per_example, seed=100)
        ref = train_reference(build_ref, batches, per_example, seed=100)
    assert opt.t == steps, f"{name}: {opt.t} updates applied, expected {steps} (a batch was lost)"
    mine, expected = persistent_arrays(model), persistent_arrays(ref)
    assert sorted(mine) == sorted(expected), (sorted(mine), sorted(expected))
    for key in expected:
        # atol only matters for the bias right before batch norm: its exact gradient is zero,
        # so both sides hold rounding noise (~1e-18 in float64, ~1e-8 in float32).
        atol = 1e-12 if np.dtype(dtype) == np.float64 else 1e-7
        assert_close(f"{name} counts={counts} {key}", mine[key], expected[key], 1e-5, atol)
    everyone = comm.allgather_obj(mine)
    for other in everyone:
        for key in expected:
            if not np.array_equal(other[key], everyone[0][key]):
                raise AssertionError(f"{name}: {key} differs between ranks")


even = [4] * size
uneven = [3, 5] if size == 2 else [2, 3, 4, *([3] * (size - 3))]


def mlp_mn() -> chainer.Link:
    return MLP(multi_node_bn, lazy=False)


def mlp_ref() -> chainer.Link:
    return MLP(plain_bn, lazy=False)


def cnn_mn() -> chainer.Link:
    return create_mnbn_model(CNN(plain_bn), comm)


def cnn_ref() -> chainer.Link:
    return CNN(plain_bn)


check_parity("mlp", mlp_mn, mlp_ref, even, (5,))
check_parity("mlp", mlp_mn, mlp_ref, uneven, (5,))
passed("MLP with MultiNodeBatchNormalization, even and uneven batches", comm)

check_parity("cnn", cnn_mn, cnn_ref, even, (2, 4, 4))
check_parity("cnn", cnn_mn, cnn_ref, uneven, (2, 4, 4))
passed("CNN via create_mnbn_model, even and uneven batches", comm)

check_parity("mlp per-example", mlp_mn, mlp_ref, uneven, (5,), per_example=True)
passed("uneven batches with per-example loss weighting", comm)

check_parity("mlp float32", mlp_mn, mlp_ref, uneven, (5,), dtype=np.float32)
check_parity("cnn float32", cnn_mn, cnn_ref, uneven, (2, 4, 4), dtype=np.float32)
passed("float32 models within 1e-5", comm)

check_parity("two heads", lambda: TwoHeads(multi_node_bn), lambda: TwoHeads(plain_bn), uneven, (5,))
passed("a head unused on some ranks: zero_fill averages zeros for it", comm)

check_parity(
    "lazy mlp",
    lambda: MLP(multi_node_bn, lazy=True),
    lambda: MLP(plain_bn, lazy=True),
    uneven,
    (5,),
)
passed("lazily initialised Linear(None, n): broadcast after init, no batch lost", comm)


def check_forward_count() -> None:
    """The lazy-parameter forward runs once; a lazy link that is never used costs nothing later."""
    np.random.seed(300 + rank)
    model = MLP(multi_node_bn, lazy=True)
    with model.init_scope():
        model.unused = L.Linear(None, 2)  # never called: its parameters stay uninitialised
    opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm)
    opt.setup(model)
    x = np.random.RandomState(rank).randn(4, 5)
    calls = []

    def loss_fn() -> Any:
        calls.append(chainer.config.in_recomputing)
        return F.sum(model(x))

    for _ in range(3):
        opt.update(loss_fn)
    assert calls == [True, False, False, False], calls
    assert model.unused.W.array is None and opt.t == 3
    assert model.bn.avg_mean is not None


check_forward_count()
passed("one extra forward, in recomputing mode, only when lazy parameters appear", comm)


def check_update_without_lossfun() -> None:
    """Gradients computed by the caller (a hand-written loop). With every parameter's shape
    known, ``setup`` broadcasts rank 0's parameters, so the first update is a real step; with
    lazy parameters born in the caller's forward, the first update only broadcasts (ChainerMN's
    rule, the one case that still loses a step)."""
    for lazy in (False, True):
        np.random.seed(200 + rank)
        model = MLP(multi_node_bn, lazy=lazy)
        opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), comm)
        opt.setup(model)
        np.random.seed(200)
        rank0_init = persistent_arrays(MLP(plain_bn, lazy=lazy))
        x = np.random.RandomState(rank).randn(4, 5)
        t = np.zeros(4, np.int32)
        if not lazy:
            after_setup = {n: np.asarray(p.array) for n, p in model.namedparams()}
            for n, value in after_setup.items():
                assert np.array_equal(value, rank0_init[n]), f"{n} not rank 0's after setup"
        for step in range(2):
            model.cleargrads()
            F.softmax_cross_entropy(model(x), t).backward()
            opt.update()
            params = {n: np.asarray(p.array) for n, p in model.namedparams()}
            if step == 0 and lazy:
                assert opt.t == 0  # only broadcast: the gradients came from unshared weights
                for other in comm.allgather_obj(params):
                    for n in params:
                        assert np.array_equal(other[n], params[n]), f"{n} not broadcast"
        assert opt.t == (1 if lazy else 2), (lazy, opt.t)
        everyone = comm.allgather_obj(params)
        for other in everyone:
            for n in params:
                assert np.array_equal(other[n], params[n]), f"{n} differs between ranks"


check_update_without_lossfun()
passed("update() without a loss function: a real first step once setup has broadcast", comm)


def check_attribute_pass_through() -> None:
    model = MLP(multi_node_bn, lazy=False)
    actual = chainer.optimizers.MomentumSGD(lr=0.01)
    opt = mn.create_multi_node_optimizer(actual, comm)
    assert opt.setup(model) is opt
    assert opt.target is model and actual.target is model
    assert opt.lr == 0.01
    opt.lr = 0.05
    assert actual.lr == 0.05 and opt.lr == 0.05
    opt.momentum = 0.5
    assert actual.momentum == 0.5
    hook_calls: list[Any] = []

    def counting_hook(optimizer: Any) -> None:
        hook_calls.append(optimizer)

    opt.add_hook(counting_hook, name="counting")
    x = np.random.RandomState(rank).randn(3, 5)
    opt.update(lambda: F.sum(model(x)))
    opt.update(lambda: F.sum(model(x)))
    assert actual.t == opt.t == 2
    assert hook_calls == [actual, actual], hook_calls
    buffer = io.BytesIO()
    chainer.serializers.save_npz(buffer, opt)
    buffer.seek(0)
    fresh = chainer.optimizers.MomentumSGD(lr=0.01)
    fresh.setup(MLP(multi_node_bn, lazy=False))
    chainer.serializers.load_npz(buffer, fresh)
    assert fresh.t == 2
    restored = dict(fresh.target.namedparams())
    for name, param in model.namedparams():
        assert np.array_equal(restored[name].update_rule.state["v"], param.update_rule.state["v"])
    try:
        mn.create_multi_node_optimizer(chainer.optimizers.SGD(), comm, double_buffering=True)
    except ValueError as error:
        assert "pure_nccl" in str(error)
    else:
        raise AssertionError("double_buffering on a CPU communicator must be refused")


check_attribute_pass_through()
passed("attributes pass through to the wrapped optimizer", comm)


def check_trainer_run() -> None:
    """What a converted script does: scatter, StandardUpdater, Trainer; equals one process."""
    from mnify.runtime.datasets.scatter_dataset import scatter_dataset

    per_rank, iterations = 4, 3
    n = per_rank * size * iterations
    rng = np.random.RandomState(11)
    data = chainer.datasets.TupleDataset(rng.randn(n, 5), rng.randint(0, 3, n).astype(np.int32))

    np.random.seed(500 + rank)
    model = L.Classifier(MLP(multi_node_bn, lazy=False))
    opt = mn.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), comm)
    opt.setup(model)
    shard = scatter_dataset(data if rank == 0 else None, comm)
    updater = chainer.training.StandardUpdater(
        chainer.iterators.SerialIterator(shard, per_rank, shuffle=False), opt
    )
    chainer.training.Trainer(updater, (iterations, "iteration"), out=os.getcwd()).run()

    np.random.seed(500)
    ref = L.Classifier(MLP(plain_bn, lazy=False))
    ref_opt = chainer.optimizers.MomentumSGD(lr=0.1)
    ref_opt.setup(ref)
    shard_len = n // size
    for i in range(iterations):  # the global batch: every rank's i-th batch, in rank order
        rows = np.concatenate(
            [
                np.arange(r * shard_len + i * per_rank, r * shard_len + (i + 1) * per_rank)
                for r in range(size)
            ]
        )
        ref_opt.update(ref, *chainer.dataset.concat_examples([data[int(j)] for j in rows]))
    mine, expected = persistent_arrays(model), persistent_arrays(ref)
    for key in expected:
        assert_close(f"trainer {key}", mine[key], expected[key], 1e-5, 1e-12)


check_trainer_run()
passed("a Trainer with StandardUpdater equals one process on the global batches", comm)
