"""Model-parallel pieces on CuPy arrays, 2 ranks sharing the node's GPU (skipped without one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

HERE = Path(__file__).resolve().parent


@pytest.mark.gpu
@pytest.mark.mpi
def test_model_parallel_on_gpu() -> None:
    cuda = pytest.importorskip("chainer.backends.cuda")
    if not cuda.available:
        pytest.skip("Chainer's CUDA backend is not available with this CuPy")
    run = run_ranks(2, HERE / "ranks_gpu.py", timeout=300)
    for r in range(2):
        lines = run.rank_lines(r)
        not_passed = missing(lines, ("gpu_parallel_convolution", "gpu_allgather", "gpu_send_recv"))
        assert not not_passed, f"rank {r} did not pass {not_passed}\n{run.describe()}"
