"""``pure_nccl`` on one rank, on raw CuPy arrays (skipped without CuPy and a device).

One rank is all a single-GPU machine can run (NCCL refuses two ranks on one device), and it
still drives every NCCL call, the pack/unpack kernels, the casts and the scales end to end:
a sum over one rank is the array itself, a mean over one rank too, so results are exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _cp() -> Any:
    import cupy  # type: ignore[import-not-found]

    return cupy


class _Param:
    def __init__(self, data: Any, grad: Any) -> None:
        self.data = data
        self.grad = grad


class _Model:
    """Anything with ``namedparams()`` will do: the communicators never import Chainer."""

    def __init__(self, params: dict[str, _Param]) -> None:
        self.params = params

    def namedparams(self) -> Iterator[tuple[str, _Param]]:
        return iter(self.params.items())


@pytest.fixture(scope="module")
def comm() -> Iterator[Any]:
    from mnify.runtime.communicators import create_communicator

    c = create_communicator("pure_nccl")
    yield c
    c.finalize()


def test_identity(comm: Any) -> None:
    assert comm.name == "pure_nccl" and comm.size == 1 and comm.rank == 0
    assert comm.device_id == comm.intra_rank == 0


def test_auto_picks_pure_nccl() -> None:
    from mnify.runtime.communicators import create_communicator

    c = create_communicator("auto")
    try:
        assert c.name == "pure_nccl"
    finally:
        c.finalize()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32])
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_allreduce(comm: Any, dtype: Any, op: str) -> None:
    cp = _cp()
    x = cp.asarray((np.arange(12).reshape(3, 4) - 5).astype(dtype))
    y = comm.allreduce(x, op)
    assert isinstance(y, cp.ndarray) and y.dtype == x.dtype and y.shape == x.shape
    assert y.data.ptr != x.data.ptr
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(x))


def test_allreduce_int16_falls_back_to_mpi(comm: Any) -> None:
    cp = _cp()
    x = cp.asarray(np.array([3, -1], dtype=np.int16))  # NCCL has no int16
    y = comm.allreduce(x, "max")
    assert isinstance(y, cp.ndarray) and y.dtype == cp.int16
    assert cp.asnumpy(y).tolist() == [3, -1]


def test_all_reduce_with_division(comm: Any) -> None:
    cp = _cp()
    arrays = [
        cp.full((3, 3), 4.0, cp.float32),
        cp.arange(5, dtype=cp.float64),
        cp.zeros(0, cp.float32),
    ]
    before = [cp.asnumpy(a) for a in arrays]
    comm.all_reduce(arrays, division=True)  # mean over one rank: unchanged
    for a, b in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(cp.asnumpy(a), b)
    comm.all_reduce(arrays)
    for a, b in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(cp.asnumpy(a), b)


def test_all_reduce_numpy_uses_mpi_path(comm: Any) -> None:
    arrays = [np.ones(4, np.float32)]
    comm.all_reduce(arrays, division=True)
    assert arrays[0].tolist() == [1.0] * 4


def test_bcast(comm: Any) -> None:
    cp = _cp()
    x = cp.arange(10, dtype=cp.float16).reshape(2, 5)
    y = comm.bcast(x, root=0)
    assert isinstance(y, cp.ndarray) and y.shape == (2, 5) and y.dtype == cp.float16
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(x))
    assert comm.bcast(np.arange(3)).tolist() == [0, 1, 2]


def test_allgather_and_host_fallbacks(comm: Any) -> None:
    cp = _cp()
    x = cp.arange(7, dtype=cp.float32)
    (g,) = comm.allgather(x)
    assert isinstance(g, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(g), np.arange(7, dtype=np.float32))
    (a,) = comm.alltoall([x.reshape(7, 1)])
    assert isinstance(a, cp.ndarray) and a.shape == (7, 1) and a.data.ptr != x.data.ptr
    np.testing.assert_array_equal(cp.asnumpy(a).ravel(), np.arange(7, dtype=np.float32))
    (g0,) = comm.gather(x)  # no NCCL gather: host staging, still a CuPy result
    np.testing.assert_array_equal(cp.asnumpy(g0), np.arange(7, dtype=np.float32))
    assert comm.bcast_obj({"a": 1}) == {"a": 1}
    assert comm.allreduce_obj(3) == 3


def _model(cp: Any, grad_dtype: Any = None) -> _Model:
    rng = np.random.default_rng(0)
    shapes = {"b/W": (64, 3, 7, 7), "a/b": (10,), "c/gamma": (33,), "d/W": (1000, 20)}
    params = {}
    for name, shape in shapes.items():
        data = cp.asarray(rng.standard_normal(shape).astype(np.float32))
        grad = cp.asarray(rng.standard_normal(shape).astype(grad_dtype or np.float32))
        params[name] = _Param(data, grad)
    return _Model(params)


def test_multi_node_mean_grad_exact_on_one_rank(comm: Any) -> None:
    cp = _cp()
    model = _model(cp)
    before = {n: cp.asnumpy(p.grad) for n, p in model.params.items()}
    stream = cp.cuda.Stream(non_blocking=True)
    comm.multi_node_mean_grad(model, stream=stream)
    stream.synchronize()
    for n, p in model.params.items():
        np.testing.assert_array_equal(cp.asnumpy(p.grad), before[n])


def test_multi_node_mean_grad_zero_fill(comm: Any) -> None:
    cp = _cp()
    model = _model(cp)
    model.params["a/b"].grad = None
    comm.multi_node_mean_grad(model, zero_fill=True)
    assert model.params["a/b"].grad is not None
    assert float(cp.abs(model.params["a/b"].grad).max()) == 0.0


def test_fp16_transport_within_fp16_tolerance() -> None:
    cp = _cp()
    from mnify.runtime.communicators import create_communicator

    c = create_communicator("pure_nccl", allreduce_grad_dtype=np.float16)
    try:
        model = _model(cp)
        before = {n: cp.asnumpy(p.grad) for n, p in model.params.items()}
        c.multi_node_mean_grad(model)
        for n, p in model.params.items():
            assert p.grad.dtype == cp.float32
            np.testing.assert_allclose(cp.asnumpy(p.grad), before[n], rtol=1e-3, atol=1e-3)
            # it really went through float16: exact float32 survives only where representable
            assert np.array_equal(
                cp.asnumpy(p.grad), before[n].astype(np.float16).astype(np.float32)
            )
    finally:
        c.finalize()


def test_small_buckets_split_arrays() -> None:
    cp = _cp()
    from mnify.runtime.communicators import create_communicator

    c = create_communicator("pure_nccl", bucket_bytes=4096)
    try:
        model = _model(cp)
        before = {n: cp.asnumpy(p.grad) for n, p in model.params.items()}
        c.multi_node_mean_grad(model)
        for n, p in model.params.items():
            np.testing.assert_array_equal(cp.asnumpy(p.grad), before[n])
    finally:
        c.finalize()


def test_bcast_data_in_place(comm: Any) -> None:
    cp = _cp()
    model = _model(cp)
    ptrs = {n: p.data.data.ptr for n, p in model.params.items()}
    before = {n: cp.asnumpy(p.data) for n, p in model.params.items()}
    comm.bcast_data(model)
    for n, p in model.params.items():
        assert p.data.data.ptr == ptrs[n]
        np.testing.assert_array_equal(cp.asnumpy(p.data), before[n])


def test_split_keeps_the_device(comm: Any) -> None:
    cp = _cp()
    sub = comm.split(color=0, key=0)
    try:
        assert sub.name == "pure_nccl" and sub.device_id == comm.device_id
        y = sub.allreduce(cp.ones(3, cp.float32))
        assert cp.asnumpy(y).tolist() == [1.0, 1.0, 1.0]
    finally:
        sub.finalize()


def test_watchdog_path_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    cp = _cp()
    from mnify.runtime.communicators import create_communicator

    monkeypatch.setenv("MNIFY_WATCHDOG_TIMEOUT", "30")
    c = create_communicator("pure_nccl")
    try:
        model = _model(cp)
        c.multi_node_mean_grad(model)
        assert cp.asnumpy(c.allreduce(cp.ones(2, cp.float32))).tolist() == [1.0, 1.0]
    finally:
        c.finalize()


def test_the_communicator_selects_its_device(comm: Any) -> None:
    cp = _cp()
    assert cp.cuda.Device().id == comm.device_id
    stream = cp.cuda.Stream(non_blocking=True)  # made now: on the communicator's device
    assert stream.device_id in (-1, comm.device_id)


def test_strided_gradients_on_a_side_stream(comm: Any) -> None:
    """The side stream waits for the current one, then makes the contiguous copy of a strided
    gradient in its own memory arena: the caller's next allocation on the current stream (here
    filled with NaN at once) cannot take that memory while the side stream still reduces and
    writes it back (one rank: the values come back as they were)."""
    cp = _cp()
    rng = np.random.default_rng(3)
    wide = cp.asarray(rng.standard_normal((512, 1024, 2)).astype(np.float32))
    model = _Model(
        {
            "s/W": _Param(cp.zeros((512, 1024), cp.float32), wide[..., 0]),
            "a/b": _Param(cp.zeros(3, cp.float32), cp.ones(3, cp.float32)),
        }
    )
    before = cp.asnumpy(wide[..., 0])
    stream = cp.cuda.Stream(non_blocking=True)
    for _ in range(3):
        comm.multi_node_mean_grad(model, stream=stream)
        junk = cp.full((512, 1024), cp.nan, cp.float32)  # the caller's next allocation
    cp.cuda.get_current_stream().synchronize()
    stream.synchronize()
    del junk
    np.testing.assert_array_equal(cp.asnumpy(wide[..., 0]), before)
    np.testing.assert_array_equal(cp.asnumpy(model.params["a/b"].grad), np.ones(3, np.float32))


def test_overlap_scheduler_with_a_main_communicator_collective_inside(comm: Any) -> None:
    """The overlap path on one GPU: buckets packed and all-reduced on the scheduler's side
    stream over its own NCCL communicator, a strided gradient, and a collective of the main
    communicator queued between two buckets (as MultiNodeBatchNormalization's inside
    backward): every NCCL launch chained in one order, exact values on one rank."""
    cp = _cp()
    from mnify.runtime.overlap import BucketScheduler, OverlapChannel

    channel = OverlapChannel(comm, on_device=True)
    try:
        reducer = channel.reducer(np.dtype(np.float32))
        shapes = [(4096,), (64, 33), (1000,)]
        sched = BucketScheduler([int(np.prod(s)) for s in shapes], reducer, bucket_bytes=16384)
        rng = np.random.default_rng(5)
        hosts = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        wide = cp.asarray(np.stack([hosts[1], hosts[1]], axis=-1))
        grads = [cp.asarray(hosts[0]), wide[..., 0], cp.asarray(hosts[2])]
        for _ in range(2):
            sched.ready(0, grads[0])
            stats = comm.allreduce(cp.arange(8, dtype=cp.float32))
            sched.ready(1, grads[1])
            sched.ready(2, grads[2])
            sched.wait(lambda i: grads[i])
            cp.cuda.get_current_stream().synchronize()
            np.testing.assert_array_equal(cp.asnumpy(stats), np.arange(8, dtype=np.float32))
            for g, h in zip(grads, hosts, strict=True):
                np.testing.assert_array_equal(cp.asnumpy(g), h)
        assert sched.steps == 2 and sched.started_early >= 1
    finally:
        channel.close()
