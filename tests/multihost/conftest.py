"""Fixtures for the multi-host tests: test beds that are always torn down, skipped only where refused.

Every test in this directory is marked ``multihost``. The only reason they skip is a kernel (or
container) that refuses network/UTS namespaces; missing ``ip``/``unshare``/``tc`` is an error that
names ``scripts/install-testbed-deps.sh``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from testkit.testbed import TestBed, build, namespaces_refused

_refused: list[str | None] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/multihost/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.multihost)
            item.add_marker(pytest.mark.mpi)


def _skip_if_refused() -> None:
    if not _refused:
        _refused.append(namespaces_refused())
    if _refused[0] is not None:
        pytest.skip(_refused[0])


@pytest.fixture
def make_testbed() -> Iterator[Callable[[int], TestBed]]:
    """``make_testbed(k)`` builds k hosts (mna, mnb, ...); all are torn down when the test ends."""
    _skip_if_refused()
    beds: list[TestBed] = []

    def make(n_hosts: int) -> TestBed:
        if beds:  # one bed per process at a time: names carry the pid
            beds.pop().teardown()
        bed = build(n_hosts)
        beds.append(bed)
        return bed

    try:
        yield make
    finally:
        for bed in beds:
            bed.teardown()


@pytest.fixture(scope="module")
def bed3() -> Iterator[TestBed]:
    """Three hosts shared by a module's read-only tests (no faults, no rate limits left behind)."""
    _skip_if_refused()
    bed = build(3)
    try:
        yield bed
    finally:
        bed.teardown()
