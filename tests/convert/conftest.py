"""``pytest tests/convert --regen`` rewrites the expected fixture outputs on purpose."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--regen",
        action="store_true",
        default=False,
        help="rewrite fixtures/convert expected outputs from the current converter",
    )


@pytest.fixture
def regen(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regen", default=False))
