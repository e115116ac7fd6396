"""``pytest tests/convert --regen`` rewrites the expected fixture outputs on purpose.

Also the hypothesis profiles of the converter's property tests (``test_properties.py``):
``mnify-ci`` (the default) is derandomized, keeps no example database and is sized so all
property tests together stay within about a minute on a two-core machine (failures are not
shrunk);
``mnify-quick`` (``scripts/test.sh --quick``) draws a third as many;
``MNIFY_HYPOTHESIS_PROFILE=mnify-dev`` draws more, random examples and remembers failures.
``scripts/hypothesis_long.py`` is the long run.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import Phase, settings

settings.register_profile(
    "mnify-ci",
    max_examples=15,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    # a failure is reported as drawn: shrinking one costs minutes (scripts/hypothesis_long.py
    # shrinks and keeps the minimal examples)
    phases=(Phase.explicit, Phase.generate),
)
# scripts/test.sh --quick: a third of the CI draw, for day-to-day work
settings.register_profile(
    "mnify-quick",
    max_examples=5,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    phases=(Phase.explicit, Phase.generate),
)
settings.register_profile("mnify-dev", max_examples=300, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("MNIFY_HYPOTHESIS_PROFILE", "mnify-ci"))


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
