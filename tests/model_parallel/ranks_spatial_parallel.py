"""Rank script: a spatially parallel model equals the same model in one process (float64).

Every check builds a small CNN the way people write them (a ``chainer.Chain`` with its own
``forward``), runs it whole in this process as the reference, and through
``create_spatial_parallel_model`` over all ranks; the output, every parameter gradient (relative
to the model's largest gradient), the input gradient where asked and the batch-norm running
statistics must agree. Images have row counts that do not divide the rank count (uneven slabs),
and on 4 ranks some slabs are empty after the strides. With 4 ranks a 2 (spatial) x 2 (data)
layout is also checked against one process at the combined batch. Prints ``PASS <name>``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn
from mnify.runtime.functions.halo_exchange import counters
from mnify.runtime.links.spatial_group import SpatialSplitError
from tests.support.rank_checks import make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size
RTOL = 1e-10


class Windows(chainer.Chain):
    """Padding, BN, max pooling crossing slabs, stride 2, average pooling, dilation (grouped),
    GAP, head."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(2, 3, 3, pad=1)
            self.bn1 = L.BatchNormalization(3)
            self.conv2 = L.Convolution2D(3, 4, 3, stride=2, pad=1)
            self.conv3 = L.Convolution2D(4, 4, 3, pad=2, dilate=2, groups=2)
            self.fc = L.Linear(4, 3)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pooling_2d(h, 3, 1, 1)
        h = self.conv2(h)
        h = F.average_pooling_2d(h, 2, 1)
        h = F.leaky_relu(self.conv3(h)) + 0.5 * h
        h = F.average(h, axis=(2, 3))
        return self.fc(h)


class Strided(chainer.Chain):
    """Kernel 5 stride 2 (boundaries off the stride), max pooling cover_all, F.mean, two heads."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(1, 3, 5, stride=2, pad=2)
            self.bn = L.BatchNormalization(3)
            self.conv2 = L.Convolution2D(3, 2, (2, 3), stride=(2, 1), pad=(0, 1), nobias=True)
            self.fc = L.Linear(2, 2)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.tanh(self.bn(self.conv1(x)))
        h = F.max_pooling_2d(h, 2)  # cover_all=True: the last window hangs over the border
        h = F.concat((self.conv2(h), F.sigmoid(self.conv2(h))), axis=1)
        g = F.mean(h, axis=(2, 3))
        return self.fc(g[:, :2]) + F.sum(h, axis=(2, 3))[:, 2:]


class Branches(chainer.Chain):
    """A residual block with a projection shortcut: branches of different depths, each with its
    own exchanges and all-reduces, which every rank's backward must visit in the same order."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.stem = L.Convolution2D(1, 3, 3, pad=1)
            self.a1 = L.Convolution2D(3, 2, 3, pad=1)
            self.bn_a = L.BatchNormalization(2)
            self.a2 = L.Convolution2D(2, 4, 5, pad=2)
            self.short = L.Convolution2D(3, 4, 1)
            self.bn_s = L.BatchNormalization(4)
            self.fc = L.Linear(4, 2)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        h = F.relu(self.stem(x))
        a = self.a2(F.relu(self.bn_a(self.a1(h))))
        h = F.relu(a + self.bn_s(self.short(h)))
        return self.fc(F.mean(h, axis=(2, 3)))


class Segmenter(chainer.Chain):
    """Output is a map: returned whole on every rank."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(1, 2, 3, pad=1)
            self.conv2 = L.Convolution2D(2, 1, 3, pad=1)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        return self.conv2(F.relu(self.conv1(x)))


class Flattens(chainer.Chain):
    """The classic head that reshapes a map: mixes rows, must be refused naming its layer."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(1, 2, 3)
            self.fc = L.Linear(None, 2)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        return self.fc(F.relu(self.conv(x)))


def sequential() -> chainer.Sequential:
    """chainer.Sequential holding Chainer's functions themselves and a partial of one."""
    return chainer.Sequential(
        L.Convolution2D(1, 2, 3, pad=1),
        F.relu,
        functools.partial(F.max_pooling_2d, ksize=2),
        L.Convolution2D(2, 3, 3, pad=1),
        functools.partial(F.average_pooling_2d, ksize=3, stride=1, pad=1),
        functools.partial(F.mean, axis=(2, 3)),
        L.Linear(3, 2),
    )


def sequential_lambda() -> chainer.Sequential:
    """chainer.Sequential with a lambda (cannot be deep-copied: converted in place)."""
    return chainer.Sequential(
        L.Convolution2D(1, 2, 3, pad=1),
        lambda h: F.max_pooling_2d(h, 3, 1, 1),
        F.sum,
        lambda h: F.reshape(h, (-1, 1)),
    )


def data(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.RandomState(seed).uniform(-1, 1, shape)


def run(model: chainer.Link, x: np.ndarray, w: np.ndarray, input_grad: bool) -> dict[str, object]:
    xv = chainer.Variable(x.copy(), requires_grad=input_grad)
    model.cleargrads()
    y = model(xv)
    F.sum(y * w).backward()
    out: dict[str, object] = {"y": y.array.copy()}
    for name, p in model.namedparams():
        out["grad" + name] = p.grad.copy()
    for name, link in model.namedlinks():
        if isinstance(link, L.BatchNormalization):
            out["avg_mean" + name] = link.avg_mean.copy()
            out["avg_var" + name] = link.avg_var.copy()
    if input_grad:
        out["gx"] = xv.grad.copy()
    return out


def compare(name: str, got: dict[str, object], want: dict[str, object]) -> None:
    assert got.keys() == want.keys(), (got.keys(), want.keys())
    scale = max(
        float(np.max(np.abs(np.asarray(v)))) for k, v in want.items() if k.startswith("grad")
    )
    for key, expected in want.items():
        e, g = np.asarray(expected), np.asarray(got[key])
        assert g.shape == e.shape, f"{name} {key}: shape {g.shape} != {e.shape}"
        ref = scale if key.startswith("grad") else max(float(np.max(np.abs(e))), 1e-300)
        err = float(np.max(np.abs(g - e))) / ref
        assert err <= RTOL, f"{name} {key}: relative error {err:.3g}"


def check(
    name: str,
    make: Callable[[], chainer.Link],
    shape: tuple[int, ...],
    axis: str = "h",
    input_grad: bool = False,
    overlap: bool = True,
) -> None:
    np.random.seed(7)
    reference = _float64(make())
    x = data(1, shape)
    with chainer.using_config("train", False):
        w = data(2, reference(x).shape)
    np.random.seed(7)  # the same model again (one that cannot be copied is converted in place)
    spatial = mn.links.create_spatial_parallel_model(
        _float64(make()), comm, axis=axis, overlap=overlap
    )
    want = run(reference, x, w, input_grad)
    overlapped = counters["overlapped"]
    got = run(spatial, x, w, input_grad)
    compare(name, got, want)
    if not overlap:  # the plain path ran: every exchange waited before its convolution
        assert counters["overlapped"] == overlapped
    elif name == "segmenter_tall" and size > 1:  # slabs of >= 7 rows: interiors to overlap
        assert counters["overlapped"] > overlapped
    # the parameter names are the plain model's
    assert [n for n, _ in spatial.namedparams()] == [n for n, _ in reference.namedparams()]
    passed(name, comm)


def _float64(model: chainer.Link) -> chainer.Link:
    for p in model.params():
        if p.array is not None:
            p.array = p.array.astype(np.float64)
    for link in model.links():
        if isinstance(link, L.BatchNormalization):
            link.avg_mean = link.avg_mean.astype(np.float64)
            link.avg_var = link.avg_var.astype(np.float64)
    return model


def check_training() -> None:
    """Three SGD steps through L.Classifier with a plain optimizer reach the same parameters."""
    np.random.seed(3)
    base = _float64(L.Classifier(Windows()))
    spatial = mn.links.create_spatial_parallel_model(base, comm)
    x = data(4, (4, 2, 13, 11))
    t = np.array([0, 2, 1, 2], dtype=np.int32)
    for model in (base, spatial):
        opt = chainer.optimizers.MomentumSGD(lr=0.1)
        opt.setup(model)
        for _ in range(3):
            opt.update(model, x.copy(), t)
    for (name, p), (_, q) in zip(base.namedparams(), spatial.namedparams(), strict=True):
        err = float(np.max(np.abs(p.array - q.array)))
        assert err <= 1e-10, f"training {name}: {err}"
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        base(x, t)
        loss = spatial(x, t)  # test mode: the running statistics, row by row
    assert loss.creator is None
    assert float(np.max(np.abs(base.y.array - spatial.y.array))) <= 1e-10
    passed("training_classifier", comm)


def check_refusals() -> None:
    np.random.seed(0)
    flat = mn.links.create_spatial_parallel_model(_float64(Flattens()), comm)
    try:
        flat(data(0, (1, 1, 9, 9)))
    except SpatialSplitError as e:
        assert "/fc" in str(e) and "mixes rows" in str(e), str(e)
    else:
        raise AssertionError("a row-mixing head was not refused")

    class Upsamples(chainer.Chain):
        def __init__(self) -> None:
            super().__init__()
            with self.init_scope():
                self.up = L.Deconvolution2D(1, 1, 2, stride=2)

    try:
        mn.links.create_spatial_parallel_model(Upsamples(), comm)
    except SpatialSplitError as e:
        assert "/up" in str(e) and "Deconvolution2D" in str(e), str(e)
    else:
        raise AssertionError("Deconvolution2D was not refused at construction")
    passed("refusals", comm)


def check_halo_only_at_neighbours() -> None:
    """A 3x3 convolution sends exactly one row each way between neighbours (no more)."""
    np.random.seed(1)
    model = _float64(Segmenter())
    spatial = mn.links.create_spatial_parallel_model(model, comm)
    x = data(5, (2, 1, 12, 6))  # an array: needs no gradient, so conv1 reads its halo locally
    before = dict(counters)
    spatial(x)  # conv2 exchanges a halo of 1 row each way
    sent = counters["halo_bytes_sent"] - before["halo_bytes_sent"]
    neighbours = (1 if rank > 0 else 0) + (1 if rank < size - 1 else 0)
    assert sent == neighbours * 2 * 2 * 1 * 6 * 8, (sent, neighbours)  # N * C * rows * W * 8
    passed("halo_rows", comm)


def check_hybrid() -> None:
    """2 (spatial) x 2 (data) on 4 ranks equals one process at the combined batch of 4."""
    spatial_comm = comm.split(rank // 2, rank)
    data_comm = comm.split(rank % 2, rank)
    group = rank // 2
    x = data(8, (4, 2, 13, 11))
    t = np.array([1, 0, 2, 2], dtype=np.int32)
    np.random.seed(5)
    base = _float64(L.Classifier(Windows()))
    spatial = mn.links.create_spatial_parallel_model(base, spatial_comm, batch_norm_comm=comm)
    opt = chainer.optimizers.SGD(lr=0.2)
    opt.setup(base)
    opt.update(base, x.copy(), t)  # one process, all 4 examples (loss: their mean)
    mn_opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.2), data_comm)
    mn_opt.setup(spatial)
    mine = slice(2 * group, 2 * group + 2)
    mn_opt.update(spatial, x[mine].copy(), t[mine])
    for (name, p), (_, q) in zip(base.namedparams(), spatial.namedparams(), strict=True):
        err = float(np.max(np.abs(p.array - q.array)))
        assert err <= 1e-10, f"hybrid {name}: {err}"
    passed("hybrid_2x2", comm)


check("windows", Windows, (2, 2, 13, 11))
check("windows_no_overlap", Windows, (2, 2, 13, 11), overlap=False)
check("windows_axis_w", Windows, (2, 2, 9, 14), axis="w")
check("strided", Strided, (3, 1, 17, 9))
check("strided_thin", Strided, (2, 1, 8, 7))  # 4 ranks: empty slabs after the strides
check("sequential", sequential, (2, 1, 15, 6))
check("sequential_lambda", sequential_lambda, (2, 1, 9, 4))
check("branches", Branches, (2, 1, 23, 6))
check("branches_thin", Branches, (2, 1, 5, 6))  # 4 ranks: an empty slab, no interiors
check("segmenter_input_grad", Segmenter, (2, 1, 11, 5), input_grad=True)
check("segmenter_tall", Segmenter, (1, 1, 29, 3), input_grad=True)  # wide interiors
check_training()
check_refusals()
check_halo_only_at_neighbours()
if size == 4:
    check_hybrid()
