"""The backbone: N ranks training data parallel reproduce one process on the concatenated batch.

2 and 3 ranks, a small MLP and a small CNN with MultiNodeBatchNormalization, MomentumSGD, even
and uneven per-rank batches, ranks starting from different random initialisations, a lazily
initialised layer; plus the optimizer wrapper's first-update and pass-through behaviour.
"""

from __future__ import annotations

import pytest

from tests.runtime.chainer_scripts.launch import run_script

pytestmark = pytest.mark.mpi

CHECKS = [
    "MLP with MultiNodeBatchNormalization, even and uneven batches",
    "CNN via create_mnbn_model, even and uneven batches",
    "uneven batches with per-example loss weighting",
    "float32 models within 1e-5",
    "a head unused on some ranks: zero_fill averages zeros for it",
    "lazily initialised Linear(None, n): broadcast after init, no batch lost",
    "one extra forward, in recomputing mode, only when lazy parameters appear",
    "update() without a loss function: a real first step once setup has broadcast",
    "attributes pass through to the wrapped optimizer",
    "a Trainer with StandardUpdater equals one process on the global batches",
]


@pytest.mark.parametrize(("n_ranks", "comm"), [(2, "naive"), (3, "naive"), (3, "flat")])
def test_data_parallel_parity(n_ranks: int, comm: str) -> None:
    run_script(n_ranks, "parity_checks.py", CHECKS, comm=comm)


@pytest.mark.parametrize("n_ranks", [2, 3])
@pytest.mark.parametrize("path", ["1", "0"], ids=["single-copy", "segment"])
def test_parity_on_each_one_host_path_of_flat(n_ranks: int, path: str) -> None:
    """flat on one host, each path alone (by default it times both and keeps the faster):
    single copy between the ranks' gradient arrays, and the shared-memory segment."""
    run_script(
        n_ranks, "parity_checks.py", CHECKS, comm="flat", extra_env={"MNIFY_SINGLE_COPY": path}
    )


@pytest.mark.smoke
def test_parity_in_debug_mode() -> None:
    """MNIFY_DEBUG=1 compares every collective's shapes: uneven batches must not look like a bug."""
    run_script(2, "parity_checks.py", CHECKS, extra_env={"MNIFY_DEBUG": "1"})


def test_parity_on_hierarchical_over_two_fake_hosts() -> None:
    """3 ranks as hosts of 2 and 1 ranks: intra-host reduce, inter-host allreduce, broadcast."""
    run_script(3, "parity_checks.py", CHECKS, comm="hierarchical", ranks_per_host=2)
