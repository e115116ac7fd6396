"""Shared pytest configuration.

* The ``gpu`` marker skips without a CUDA device.
* Tests in modules that launch real ranks (through the launch helpers of ``testkit``,
  ``tests/support`` and friends) are marked ``mpi`` automatically, so ``scripts/test.sh --quick`` can leave them out
  without every module having to remember its marker; ``smoke`` marks the few 2-rank runs the
  quick tier keeps (README, "Tests").
"""

from __future__ import annotations

import pytest


def _has_gpu() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


# The helpers that start mpiexec (or a multi-host test bed) for a test.
_LAUNCHERS = frozenset({"run_ranks", "run_script", "mnify_run", "run_verdict", "TestBed"})


def _launches_ranks(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    if module is None:
        return False
    return any(
        name in _LAUNCHERS
        and str(getattr(obj, "__module__", "")).startswith(("tests.", "testkit."))
        for name, obj in vars(module).items()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("mpi") is None and _launches_ranks(item):
            item.add_marker(pytest.mark.mpi)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA device/CuPy on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
