"""MultiNodeBatchNormalization and create_mnbn_model on 2 and 3 real ranks (uneven batches included)."""

from __future__ import annotations

import pytest

from tests.runtime.chainer_scripts.launch import run_script

pytestmark = pytest.mark.mpi

CHECKS = [
    "function matches batch_normalization of the concatenated batch, even and uneven",
    "function with an empty batch on rank 0",
    "link running statistics, identical ranks, no communication in test mode",
    "link options: no gamma/beta, lazy size, finetune, tuple size",
    "mixed16: float16 activations, float32 statistics",
    "float32 inputs with a large offset keep their variance",
    "create_mnbn_model on Chain, Sequential and ChainList",
]


@pytest.mark.parametrize("n_ranks", [2, 3])
def test_multi_node_batch_normalization(n_ranks: int) -> None:
    run_script(n_ranks, "mnbn_checks.py", CHECKS)
