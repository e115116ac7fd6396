"""Helpers the rank scripts of these tests share (they run under mpiexec, not pytest)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def make_comm() -> Any:
    """The CPU communicator the rank scripts test against (``MNIFY_TEST_COMMUNICATOR``: naive)."""
    from mnify import runtime as mn

    return mn.create_communicator(os.environ.get("MNIFY_TEST_COMMUNICATOR", "naive"))


def assert_close(name: str, got: Any, want: Any, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Compare with a message that names the check and this rank's worst difference."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {got.shape} != expected {want.shape}")
    if got.dtype != want.dtype:
        raise AssertionError(f"{name}: dtype {got.dtype} != expected {want.dtype}")
    if not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol):
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
        raise AssertionError(f"{name}: max abs difference {diff:g} (rtol {rtol}, atol {atol})")
