"""The ``--verify`` verdict of a 2-rank test run, as data (docs/verify.md).

A test that launches ranks itself (not through ``mnify run``) sets :func:`verify_env`: the
first K updates are verified, then every rank stops, and rank 0 writes the verdict as one JSON
line (the form ``mnify run`` reads, so the test asserts on structure, not on the rendered
block). :func:`verdict_of` finds it in rank 0's output.
"""

from __future__ import annotations

import json
from typing import Any

from mnify import environment
from mnify.runtime.verify.session import REPORT_PREFIX
from tests.support.mpirun import RankRun

UPDATES = 3  # the "mnify run --verify": the first 3 updates, as --verify's default


def verify_env(updates: int = UPDATES) -> dict[str, str]:
    """Environment that verifies the first ``updates`` updates and reports them as JSON."""
    wiring = environment.LaunchWiring(verify_report=True)
    return {environment.VERIFY.name: str(updates), environment.LAUNCH.name: wiring.to_text()}


def verdict_of(run: RankRun) -> dict[str, Any]:
    """Rank 0's verdict; AssertionError with all output when rank 0 printed none."""
    found = [line.split(REPORT_PREFIX, 1)[1] for line in run.rank_lines(0) if REPORT_PREFIX in line]
    assert found, f"rank 0 printed no verdict\n{run.describe()[-8000:]}"
    verdict: dict[str, Any] = json.loads(found[-1])
    return verdict


def findings_of(verdict: dict[str, Any]) -> list[str]:
    """One line per finding: check, ranks, where, message."""
    return [
        f"{f['check']} ranks {f['ranks']} at {f['where']}: {f['message']}"
        for f in verdict.get("findings", [])
    ]
