"""The parts of ``pure_nccl`` that need no GPU: availability report, errors, bucketing.

Kept out of tests/gpu: tests/conftest.py skips every test whose keywords include "gpu", and a
directory name counts as a keyword.
"""

from __future__ import annotations

import pytest

from mnify.runtime.communicators.pure_nccl import (
    device_buckets,
    format_nccl_version,
    nccl_status,
)
from tests.support.mpirun import run_ranks


def _has_cupy() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]  # noqa: F401
    except Exception:
        return False
    return True


def test_nccl_status_never_raises_and_explains() -> None:
    ok, why = nccl_status()
    assert isinstance(ok, bool) and why
    if not _has_cupy():
        assert not ok and "CuPy" in why


@pytest.mark.skipif(_has_cupy(), reason="CuPy is installed: the missing-CuPy error cannot happen")
def test_constructing_without_cupy_says_what_is_missing() -> None:
    script = """
from mnify.runtime.communicators import create_communicator
from mnify.runtime.communicators.pure_nccl import PureNcclCommunicator
for make in (lambda: create_communicator("pure_nccl"), PureNcclCommunicator):
    try:
        make()
    except RuntimeError as exc:
        print("ERROR", exc)
    else:
        print("NO ERROR")
"""
    run = run_ranks(2, script, timeout=120)
    for r in range(2):
        lines = run.rank_lines(r)
        assert len(lines) == 2, run.output
        for line in lines:
            assert line.startswith("ERROR the pure_nccl communicator cannot run here: CuPy")
            assert "'flat'" in line


def test_format_nccl_version() -> None:
    assert format_nccl_version(22304) == "2.23.4"
    assert format_nccl_version(2708) == "2.7.8"
    assert format_nccl_version(0) == "unknown"


def test_device_buckets() -> None:
    assert device_buckets([3, 0, 5], None) == [[(0, 0, 3), (2, 0, 5)]]
    assert device_buckets([], None) == []
    assert device_buckets([0, 0], 4) == []
    assert device_buckets([3, 0, 5], 4) == [[(0, 0, 3), (2, 0, 1)], [(2, 1, 5)]]
    assert device_buckets([10], 3) == [[(0, 0, 3)], [(0, 3, 6)], [(0, 6, 9)], [(0, 9, 10)]]
    # every element in exactly one bucket, no bucket over the limit
    sizes = [7, 1, 0, 13, 4, 4]
    buckets = device_buckets(sizes, 5)
    assert all(sum(hi - lo for _, lo, hi in b) <= 5 for b in buckets)
    covered = {i: 0 for i in range(len(sizes))}
    for b in buckets:
        for i, lo, hi in b:
            covered[i] += hi - lo
    assert [covered[i] for i in range(len(sizes))] == sizes
