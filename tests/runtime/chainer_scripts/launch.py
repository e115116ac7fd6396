"""Pytest side: run one rank script of this folder on N ranks and check every rank passed each step."""

from __future__ import annotations

from pathlib import Path

from tests.support.mpirun import RankRun, run_ranks
from tests.support.rank_checks import missing

SCRIPTS = Path(__file__).resolve().parent


def run_script(
    n: int,
    script: str,
    expected: list[str],
    *,
    comm: str = "naive",
    ranks_per_host: int | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 240,
) -> RankRun:
    """Run ``script`` on ``n`` ranks with communicator ``comm``; every rank must print
    ``PASS <name>`` for each expected name. ``ranks_per_host`` fakes several hosts."""
    env = {"MNIFY_TEST_COMM": comm}
    if ranks_per_host:
        env["MNIFY_TEST_RANKS_PER_HOST"] = str(ranks_per_host)
    env.update(extra_env or {})
    run = run_ranks(n, SCRIPTS / script, timeout=timeout, env=env)
    for rank in range(n):
        not_passed = missing(run.rank_lines(rank), expected)
        assert not not_passed, f"rank {rank} did not pass {not_passed}\n{run.describe()}"
    return run
