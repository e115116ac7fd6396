"""Shared by the rank scripts in this folder: the communicator under test and comparison helpers.

Each rank script runs many checks in one MPI launch and prints ``PASS <name>`` per check; a
failing check raises, which ends the job with a non-zero exit (the pytest side then shows every
rank's output).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def make_comm() -> Any:
    """The communicator named by ``MNIFY_TEST_COMM`` (default ``naive``).

    ``MNIFY_TEST_RANKS_PER_HOST=k`` pretends ranks ``0..k-1`` share one host, ``k..2k-1`` the
    next, and so on (through ``MNIFY_HOSTNAME``), so the hierarchical communicator's intra- and
    inter-host paths both run on one machine.
    """
    per_host = os.environ.get("MNIFY_TEST_RANKS_PER_HOST")
    if per_host:
        world_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ["MNIFY_HOSTNAME"] = f"fakehost{world_rank // int(per_host)}"
    from mnify import runtime as mn

    return mn.create_communicator(os.environ.get("MNIFY_TEST_COMM", "naive"))


def assert_close(
    actual: Any, expected: Any, what: str, rtol: float = 1e-5, atol: float = 1e-12
) -> None:
    """``actual`` equals ``expected`` within ``rtol`` relative to the largest expected magnitude.

    ``atol`` covers arrays whose exact value is zero (a bias right before batch norm gets no
    gradient: both sides hold rounding noise around 1e-18).
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape} != expected {expected.shape}")
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-12)
    diff = float(np.max(np.abs(actual - expected), initial=0.0))
    err = diff / scale
    if not (err <= rtol or diff <= atol):
        raise AssertionError(
            f"{what}: relative error {err:.3g} > {rtol:g}\n{actual}\n!=\n{expected}"
        )


def report(comm: Any, name: str) -> None:
    """Every rank reached this point with its checks passed."""
    comm.barrier()
    print(f"PASS {name}", flush=True)
