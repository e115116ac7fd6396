"""Rank script: MultiNodeBatchNormalization against plain batch normalization of the whole batch.

Every rank builds the same global batch (same seed), normalises only its own slice with the
multi-node function/link, and compares with ``chainer.functions.batch_normalization`` on the
concatenation: outputs, input gradients, summed parameter gradients, running statistics.
Per-rank batch sizes are uneven on purpose (and one check gives a rank an empty batch).
"""

from __future__ import annotations

import copy
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn
from mnify.runtime.links.create_mnbn_model import create_mnbn_model
from tests.support.rank_checks import assert_close, make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size


def rank_slices(counts: list[int]) -> list[slice]:
    bounds = np.cumsum([0, *counts])
    return [slice(int(bounds[r]), int(bounds[r + 1])) for r in range(len(counts))]


class CountingComm:
    """Delegates to the real communicator and counts the collectives called through it."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.inner, name)
        if callable(attr):

            def counted(*args: object, **kwargs: object) -> object:
                self.calls += 1
                return attr(*args, **kwargs)

            return counted
        return attr


def check_function(
    counts: list[int], shape_tail: tuple[int, ...], dtype: type, rtol: float
) -> None:
    """multi_node_batch_normalization forward/backward == F.batch_normalization on the concat."""
    rng = np.random.RandomState(0)
    total = sum(counts)
    channel_shape = shape_tail[:1]
    x_all = (rng.randn(total, *shape_tail) * 3 + 1.5).astype(dtype)
    gy_all = rng.randn(total, *shape_tail).astype(dtype)
    gamma0 = rng.uniform(0.5, 1.5, channel_shape).astype(dtype)
    beta0 = rng.randn(*channel_shape).astype(dtype)
    mine = rank_slices(counts)[rank]

    # reference: one process, the whole batch
    x_ref = chainer.Variable(x_all.copy())
    g_ref, b_ref = chainer.Variable(gamma0.copy()), chainer.Variable(beta0.copy())
    rm_ref, rv_ref = np.zeros(channel_shape, dtype), np.ones(channel_shape, dtype)
    y_ref = F.batch_normalization(
        x_ref, g_ref, b_ref, eps=2e-5, running_mean=rm_ref, running_var=rv_ref, decay=0.7
    )
    F.sum(y_ref * gy_all).backward()

    x = chainer.Variable(x_all[mine].copy())
    g, b = chainer.Variable(gamma0.copy()), chainer.Variable(beta0.copy())
    rm, rv = np.zeros(channel_shape, dtype), np.ones(channel_shape, dtype)
    y = mn.functions.multi_node_batch_normalization(
        x, g, b, comm, eps=2e-5, running_mean=rm, running_var=rv, decay=0.7
    )
    F.sum(y * gy_all[mine]).backward()
    what = f"counts={counts} shape={shape_tail} {np.dtype(dtype).name}"
    assert_close(f"y {what}", y.array, y_ref.array[mine], rtol)
    assert_close(f"gx {what}", x.grad, x_ref.grad[mine], rtol)
    # gamma/beta gradients are per-rank sums: over the ranks they add up to the reference.
    assert_close(f"ggamma {what}", comm.allreduce(g.grad), g_ref.grad, rtol)
    assert_close(f"gbeta {what}", comm.allreduce(b.grad), b_ref.grad, rtol)
    assert_close(f"running mean {what}", rm, rm_ref, rtol)
    assert_close(f"running var {what}", rv, rv_ref, rtol)


check_function([4] * size, (3,), np.float64, 1e-10)
check_function([3, 5, 2, 6][:size], (3, 2, 2), np.float64, 1e-10)
check_function([3, 5, 2, 6][:size], (4, 3), np.float32, 1e-4)
passed("function matches batch_normalization of the concatenated batch, even and uneven", comm)

# A rank with an empty batch still takes part and gets the right statistics.
check_function([0, *([3] * (size - 1))], (2, 3), np.float64, 1e-10)
passed("function with an empty batch on rank 0", comm)


def check_link_running_stats_and_test_mode() -> None:
    """The link over several steps: running stats like L.BatchNormalization, same on all ranks."""
    rng = np.random.RandomState(1)
    ref = L.BatchNormalization(3, decay=0.8, dtype=np.float64)
    link = mn.links.MultiNodeBatchNormalization(3, comm, decay=0.8, dtype=np.float64)
    for step in range(3):
        counts = [2 + (r + step) % 3 for r in range(size)]
        x_all = rng.randn(sum(counts), 3, 2).astype(np.float64) * (step + 1)
        y_ref = ref(x_all)
        y = link(x_all[rank_slices(counts)[rank]])
        assert_close(f"link y step {step}", y.array, y_ref.array[rank_slices(counts)[rank]], 1e-10)
    assert_close("link avg_mean", link.avg_mean, ref.avg_mean, 1e-10)
    assert_close("link avg_var", link.avg_var, ref.avg_var, 1e-10)
    gathered = comm.allgather_obj((link.avg_mean, link.avg_var))
    for other_mean, other_var in gathered:
        if not (
            np.array_equal(other_mean, link.avg_mean) and np.array_equal(other_var, link.avg_var)
        ):
            raise AssertionError("running statistics differ between ranks")

    counting = CountingComm(comm)
    link.comm = counting
    x_test = rng.randn(rank + 1, 3, 2)
    with chainer.using_config("train", False):
        y = link(x_test)
        y_ref = ref(x_test)
    assert_close("test-mode output", y.array, y_ref.array, 1e-10)
    if counting.calls:
        raise AssertionError(f"test mode communicated ({counting.calls} calls)")
    link.comm = comm


check_link_running_stats_and_test_mode()
passed("link running statistics, identical ranks, no communication in test mode", comm)


def check_link_options() -> None:
    """use_gamma/use_beta off, lazy size, finetune, channel shape tuple."""
    rng = np.random.RandomState(2)
    x_all = rng.randn(size * 3, 4, 2)
    mine = slice(rank * 3, rank * 3 + 3)
    ref = L.BatchNormalization(4, use_gamma=False, use_beta=False, dtype=np.float64)
    link = mn.links.MultiNodeBatchNormalization(
        None, comm, use_gamma=False, use_beta=False, dtype=np.float64
    )
    assert_close("no gamma/beta, lazy size", link(x_all[mine]).array, ref(x_all).array[mine], 1e-10)
    assert link.avg_mean.shape == (4,)
    ref.start_finetuning()
    link.start_finetuning()
    for _ in range(2):
        ref(x_all, finetune=True)
        link(x_all[mine], finetune=True)
    assert_close("finetune avg_var", link.avg_var, ref.avg_var, 1e-10)
    assert link.N == ref.N == 2

    ref2 = L.BatchNormalization((4, 2), dtype=np.float64)
    link2 = mn.links.MultiNodeBatchNormalization((4, 2), comm, dtype=np.float64)
    assert_close("channel shape (4, 2)", link2(x_all[mine]).array, ref2(x_all).array[mine], 1e-10)


check_link_options()
passed("link options: no gamma/beta, lazy size, finetune, tuple size", comm)


def check_mixed16() -> None:
    """float16 activations with float32 parameters (Chainer's mixed16): as L.BatchNormalization."""
    rng = np.random.RandomState(5)
    counts = [2 + r for r in range(size)]
    x_all = (rng.randn(sum(counts), 3, 2) * 3 + 2).astype(np.float16)
    gy_all = rng.randn(sum(counts), 3, 2).astype(np.float16)
    mine = rank_slices(counts)[rank]
    with chainer.using_config("dtype", chainer.mixed16):
        ref = L.BatchNormalization(3)
        link = mn.links.MultiNodeBatchNormalization(3, comm)
    assert link.gamma.dtype == link.avg_mean.dtype == np.float32
    results = []
    for bn, x, gy in ((ref, x_all, gy_all), (link, x_all[mine], gy_all[mine])):
        bn.cleargrads()
        xv = chainer.Variable(x.copy())
        y = bn(xv)
        F.sum(y * gy).backward()
        assert y.dtype == xv.grad.dtype == np.float16
        results.append((y.array, xv.grad, bn.gamma.grad, bn.avg_var))
    (y_ref, gx_ref, gg_ref, var_ref), (y, gx, gg, var) = results
    assert_close("mixed16 y", y, y_ref[mine], 2e-3)
    assert_close("mixed16 gx", gx, gx_ref[mine], 2e-3)
    assert_close("mixed16 ggamma", comm.allreduce(gg), gg_ref, 1e-3)
    assert_close("mixed16 running var", var, var_ref, 1e-4)


check_mixed16()
passed("mixed16: float16 activations, float32 statistics", comm)


def check_offset_inputs_float32() -> None:
    """float32 inputs far from zero (mean 1000, spread 1): statistics must not cancel away."""
    rng = np.random.RandomState(6)
    counts = [3 + 2 * r for r in range(size)]
    x_all = rng.randn(sum(counts), 4, 5) + 1000.0
    mine = rank_slices(counts)[rank]
    link = mn.links.MultiNodeBatchNormalization(4, comm, dtype=np.float32)
    y = link(x_all[mine].astype(np.float32)).array
    exact = (x_all - x_all.mean(axis=(0, 2), keepdims=True)) / np.sqrt(
        x_all.var(axis=(0, 2), keepdims=True) + 2e-5
    )
    assert_close("normalised offset inputs", y, exact[mine], 1e-4)
    assert_close("running mean", link.avg_mean, 0.1 * x_all.mean(axis=(0, 2)), 1e-5)


check_offset_inputs_float32()
passed("float32 inputs with a large offset keep their variance", comm)


class Net(chainer.Chain):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.fc = L.Linear(3, 4)
            self.bn = L.BatchNormalization(4, decay=0.5, eps=1e-3)
            self.seq = chainer.Sequential(L.Linear(4, 4), F.relu, L.BatchNormalization(4))
            self.group = chainer.ChainList(L.BatchNormalization(4, use_beta=False))

    def forward(self, x: object) -> object:
        h = self.group[0](self.seq(self.bn(self.fc(x))))
        return h


def check_create_mnbn_model() -> None:
    """Every BatchNormalization replaced, settings/params/stats kept, the original untouched."""
    np.random.seed(3)
    net = Net()
    x = np.random.randn(6, 3).astype(np.float32)
    net(x)  # running statistics away from their initial values
    net.bn.gamma.array[:] = np.arange(4) + 1.0
    before = {name: p.array.copy() for name, p in net.namedparams()}
    converted = create_mnbn_model(net, comm)

    bns = [net.bn, net.seq[2], net.group[0]]
    mnbns = [converted.bn, converted.seq[2], converted.group[0]]
    for old, new in zip(bns, mnbns, strict=True):
        assert isinstance(new, mn.links.MultiNodeBatchNormalization), type(new)
        assert new.comm is comm
        assert (new.decay, new.eps) == (old.decay, old.eps)
        assert np.array_equal(new.avg_mean, old.avg_mean) and new.avg_mean is not old.avg_mean
        assert np.array_equal(new.avg_var, old.avg_var)
        assert (new.beta is None) == (old.beta is None)
    for old in bns:
        assert type(old) is L.BatchNormalization
    assert sorted(n for n, _ in converted.namedparams()) == sorted(before)
    for name, p in converted.namedparams():
        assert np.array_equal(p.array, before[name]), name
    assert converted.seq[2] in list(converted.seq.children())

    # the copy computes what the original computes on the whole batch
    x_all = np.random.RandomState(4).randn(size * 2, 3).astype(np.float32)
    mine = slice(rank * 2, rank * 2 + 2)
    assert_close("converted model", converted(x_all[mine]).array, net(x_all).array[mine], 1e-4)

    again = copy.deepcopy(converted)
    assert again.bn.comm is comm and again.bn is not converted.bn
    single = create_mnbn_model(L.BatchNormalization(5), comm)
    assert isinstance(single, mn.links.MultiNodeBatchNormalization)

    # batch renormalization is a different algorithm: kept, with a warning
    renorm = chainer.Sequential(L.Linear(3, 4), L.BatchRenormalization(4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = create_mnbn_model(renorm, comm)
    assert type(kept[1]) is L.BatchRenormalization
    assert any("BatchRenormalization" in str(w.message) for w in caught), caught


check_create_mnbn_model()
passed("create_mnbn_model on Chain, Sequential and ChainList", comm)
