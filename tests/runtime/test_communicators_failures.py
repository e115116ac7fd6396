"""Failure handling on real ranks: hangs become errors that end the job and name the culprit.

The culprit is always the last rank. A run that does not end on its own is killed by the
launcher's timeout (set well below the culprit's 60 s sleep) and fails the test: "the job ends"
is checked without timing anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mpirun import RankRun, run_ranks

SCRIPT = Path(__file__).parent / "comm_scripts" / "failures.py"
pytestmark = pytest.mark.mpi


def _fails(n: int, scenario: str, env: dict[str, str] | None = None) -> RankRun:
    run = run_ranks(n, SCRIPT, [scenario], env=env, timeout=45, check=False)
    assert not run.timed_out, f"the job hung instead of ending\n{run.describe()}"
    assert run.returncode != 0, run.describe()
    return run


@pytest.mark.parametrize(
    ("n", "scenario", "seq"), [(2, "sleep", 1), (3, "sleep", 1), (3, "sleep_grads", 2)]
)
def test_watchdog_names_the_rank_that_never_arrives(n: int, scenario: str, seq: int) -> None:
    run = _fails(n, scenario, {"MNIFY_WATCHDOG_TIMEOUT": "2"})
    culprit = n - 1
    assert "CollectiveTimeout" in run.output, run.describe()
    assert f"rank(s) {culprit} never arrived" in run.output, run.describe()
    assert f"rank {culprit}: still before this collective (last entered #{seq})" in run.output
    # the sleeper itself never reaches the end, and no waiting rank blames anyone else
    assert f"END {culprit}" not in run.rank_lines(culprit)
    for r in range(culprit):
        blamed = [line for line in run.rank_lines(r) if "never arrived" in line]
        assert all(f"rank(s) {culprit} never" in line for line in blamed), run.describe()


def test_watchdog_point_to_point_names_the_silent_peer() -> None:
    run = _fails(3, "sleep_p2p", {"MNIFY_WATCHDOG_TIMEOUT": "2"})
    assert "collective recv #1 timed out after 2 s on rank 0: rank(s) 2 never arrived" in (
        run.output
    ), run.describe()


@pytest.mark.parametrize("n", [2, 3])
def test_an_exception_on_one_rank_ends_the_job_with_its_traceback(n: int) -> None:
    run = _fails(n, "raise")  # no watchdog: the others block in a plain MPI allreduce
    culprit = n - 1
    lines = run.rank_lines(culprit)
    # MPI_Abort's own stderr can land on the same line first: look for the header anywhere in it
    assert any(f"[mnify] rank {culprit} (host " in line for line in lines), run.describe()
    assert any(f"ValueError: rank {culprit} gives up on purpose" in line for line in lines)
    assert "Traceback (most recent call last):" in run.output


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        ("shapes", "allreduce: ranks 0-1 passed float32(4,3) (op=sum), rank 2 passed float32(5,3)"),
        ("kinds", "ranks entered different collectives: ranks 0-1 entered allreduce, rank 2 "),
        (
            "grads",
            "multi_node_mean_grad: ranks 0-1 passed [/w: float32(2,2)], "
            "rank 2 passed [/extra: float32(3), /w: float32(2,2)]",
        ),
        ("recv_kind", "recv_obj: rank 0 expected an object from rank 2 (tag 1) but rank 2 sent"),
    ],
)
def test_debug_mode_reports_mismatches(scenario: str, message: str) -> None:
    run = _fails(3, scenario, {"MNIFY_DEBUG": "1"})
    assert "CollectiveMismatch" in run.output, run.describe()
    assert message in run.output, run.describe()


def test_two_rank_shape_mismatch_message() -> None:
    run = _fails(2, "shapes", {"MNIFY_DEBUG": "1", "MNIFY_WATCHDOG_TIMEOUT": "30"})
    assert "allreduce: rank 0 passed float32(4,3) (op=sum), rank 1 passed float32(5,3)" in (
        run.output
    ), run.describe()


def test_a_caught_mismatch_leaves_the_communicator_usable() -> None:
    run = run_ranks(3, SCRIPT, ["catch"], env={"MNIFY_DEBUG": "1"}, timeout=45)
    for r in range(3):
        assert any(line.startswith(f"CAUGHT {r} allreduce:") for line in run.rank_lines(r))
        assert f"AFTER {r} 3.0" in run.rank_lines(r)


def test_barrier_is_the_untimed_synchronisation_point() -> None:
    """Seed 000: ranks may drift apart (rank 0 evaluating); a barrier before the timed
    collectives absorbs it without tripping the watchdog."""
    run = run_ranks(3, SCRIPT, ["drift"], env={"MNIFY_WATCHDOG_TIMEOUT": "1.5"}, timeout=45)
    for r in range(3):
        assert f"AFTER {r} 3.0" in run.rank_lines(r), run.describe()
