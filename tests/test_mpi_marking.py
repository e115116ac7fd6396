"""tests/conftest.py marks a test ``mpi`` when it can reach a rank launcher, so the quick tier
(scripts/test.sh --quick) leaves out every multi-rank run and keeps the single-process tests
that sit beside them."""

from __future__ import annotations

from typing import Any

import pytest

from tests import conftest
from tests.conftest import _reaches_launcher


def fake_launcher(*args: Any) -> None:  # made a launcher by the fixture below; never called
    raise AssertionError("never called")


@pytest.fixture(autouse=True)
def _fake_launcher_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "_LAUNCHERS", conftest._LAUNCHERS | {"fake_launcher"})


def _helper_that_launches() -> None:
    fake_launcher(2, "script.py")


def _pure_helper(x: int) -> int:
    return x + 1


class _Harness:
    def go(self) -> None:
        _helper_that_launches()


def test_a_launcher_reached_through_helpers_classes_and_lambdas_is_found() -> None:
    def direct() -> None:
        fake_launcher(2)

    def through_helper() -> None:
        _helper_that_launches()

    def through_lambda() -> None:
        (lambda: _helper_that_launches())()

    def through_class() -> None:
        _Harness().go()

    for test in (direct, through_helper, through_lambda, through_class):
        assert _reaches_launcher(test, set()), test.__name__


def test_single_process_tests_beside_launchers_are_not_marked() -> None:
    def pure() -> None:
        assert _pure_helper(1) == 2

    assert not _reaches_launcher(pure, set())


def test_what_cannot_be_read_counts_as_launching() -> None:
    assert _reaches_launcher(len, set())  # a builtin has no code to read: stay mpi
