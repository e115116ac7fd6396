"""The tests' name for :mod:`testkit.ranks` (the rank launcher the benchmarks share): every
multi-process test imports :func:`run_ranks` from here."""

from testkit.ranks import REPO, RankRun, find_mpiexec, kill_job, mpi_env, run_ranks

__all__ = ["REPO", "RankRun", "find_mpiexec", "kill_job", "mpi_env", "run_ranks"]
