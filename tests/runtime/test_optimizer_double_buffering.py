"""double_buffering=True: refused off pure_nccl; on a GPU, gradients apply one step late.

The GPU test runs one rank (NCCL refuses two ranks on one device). With the same batch every
step, ChainerMN's schedule gives: updates 1 and 2 apply nothing (broadcast, then the first
averaging is still in flight), update 3 applies step 2's gradient, update 4 step 3's, both taken
at the initial parameters -- so after four updates the parameters are p0 - 2 * lr * g(p0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.runtime.chainer_scripts.launch import run_script


class _CpuComm:
    name = "naive"


def test_double_buffering_needs_pure_nccl() -> None:
    import chainer

    from mnify.runtime.optimizers import create_multi_node_optimizer

    with pytest.raises(ValueError, match="pure_nccl"):
        create_multi_node_optimizer(chainer.optimizers.SGD(), _CpuComm(), double_buffering=True)


@pytest.mark.mpi
def test_schedule_on_cpu_ranks_with_cupy_stand_in() -> None:
    run_script(
        2,
        "double_buffering_checks.py",
        ["double buffering applies averaged gradients one step late"],
    )


@pytest.fixture(scope="module")
def nccl_comm() -> Iterator[Any]:
    cuda = pytest.importorskip("chainer.backends.cuda")
    if not cuda.available:
        pytest.skip("Chainer's CUDA backend is not available with this CuPy")
    from mnify.runtime.communicators import create_communicator

    c = create_communicator("pure_nccl")
    yield c
    c.finalize()


@pytest.mark.gpu
def test_gradients_apply_one_step_late(nccl_comm: Any) -> None:
    import chainer
    import chainer.functions as F
    import chainer.links as L
    import cupy  # type: ignore[import-not-found]

    from mnify.runtime.optimizers import create_multi_node_optimizer

    device = chainer.get_device("@cupy:0")
    rng = np.random.RandomState(0)
    x = cupy.asarray(rng.randn(5, 4).astype(np.float32))
    model = L.Linear(4, 3)
    model.to_device(device)
    p0 = model.W.array.copy()
    model.cleargrads()
    F.sum(model(x) ** 2).backward()
    g0 = model.W.grad.copy()

    lr = 0.1
    opt = create_multi_node_optimizer(
        chainer.optimizers.SGD(lr=lr), nccl_comm, double_buffering=True
    )
    opt.setup(model)
    for _ in range(4):
        opt.update(lambda: F.sum(model(x) ** 2))
    opt.wait()
    assert opt.t == 2
    np.testing.assert_allclose(model.W.array.get(), (p0 - 2 * lr * g0).get(), rtol=1e-5, atol=1e-6)
