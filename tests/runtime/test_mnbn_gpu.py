"""MultiNodeBatchNormalization on CuPy arrays with the pure_nccl communicator (one rank, one GPU).

Skipped without CuPy, a device, or a Chainer whose CUDA backend accepts the installed CuPy. One
rank is all a single-GPU machine can run (NCCL refuses two ranks on one device); the statistics
still travel through NCCL, and the result must equal L.BatchNormalization on the same batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def comm() -> Iterator[Any]:
    cuda = pytest.importorskip("chainer.backends.cuda")
    if not cuda.available:
        pytest.skip("Chainer's CUDA backend is not available with this CuPy")
    from mnify.runtime.communicators import create_communicator

    c = create_communicator("pure_nccl")
    yield c
    c.finalize()


def test_forward_backward_running_stats_on_gpu(comm: Any) -> None:
    import chainer
    import chainer.functions as F
    import chainer.links as L
    import cupy  # type: ignore[import-not-found]

    from mnify.runtime.links.batch_normalization import MultiNodeBatchNormalization

    device = chainer.get_device("@cupy:0")
    rng = np.random.RandomState(0)
    x = rng.randn(6, 3, 4, 4).astype(np.float32) * 2 + 1
    gy = rng.randn(6, 3, 4, 4).astype(np.float32)
    ref = L.BatchNormalization(3)
    link = MultiNodeBatchNormalization(3, comm)
    ref.to_device(device)
    link.to_device(device)
    outputs = []
    for bn in (ref, link):
        xv = chainer.Variable(cupy.asarray(x))
        y = bn(xv)
        F.sum(y * cupy.asarray(gy)).backward()
        assert isinstance(y.array, cupy.ndarray)
        outputs.append((y.array.get(), xv.grad.get(), bn.gamma.grad.get(), bn.beta.grad.get()))
    for got, want in zip(outputs[1], outputs[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(link.avg_mean.get(), ref.avg_mean.get(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(link.avg_var.get(), ref.avg_var.get(), rtol=1e-5, atol=1e-6)
    with chainer.using_config("train", False):
        np.testing.assert_allclose(
            link(cupy.asarray(x)).array.get(), ref(cupy.asarray(x)).array.get(), rtol=1e-4
        )
