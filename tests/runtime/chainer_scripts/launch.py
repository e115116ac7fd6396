"""Pytest side: run one rank script of this folder on N ranks and check every rank passed each step."""

from __future__ import annotations

from pathlib import Path

from tests.support.mpirun import RankRun, run_ranks

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
        passed = [line[len("PASS ") :] for line in run.rank_lines(rank) if line.startswith("PASS ")]
        missing = [name for name in expected if name not in passed]
        assert not missing, f"rank {rank} did not pass {missing}\n{run.describe()}"
    return run
