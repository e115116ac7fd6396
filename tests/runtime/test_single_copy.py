"""Single-copy means (cross-memory attach) on real ranks, and the measured choice of path.

The rank script compares the single-copy path with the shared-memory segment bit for bit on 2
and 3 ranks; the choice between them is tested here with a made-up clock, where which path is
faster is known.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mnify.runtime.communicators.path_choice import MeasuredChoice
from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

SCRIPT = Path(__file__).parent / "comm_scripts" / "single_copy.py"


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_single_copy_equals_the_segment(n: int) -> None:
    run = run_ranks(n, SCRIPT, timeout=240)
    for r in range(n):
        not_passed = missing(run.rank_lines(r), ["probe", "same-bits", "choice"])
        assert not not_passed, f"rank {r} did not finish {not_passed}\n{run.describe()}"


class Clock:
    """Each path takes the time the test gives it; ``now`` advances as paths run."""

    def __init__(self, cost: dict[str, float]) -> None:
        self.now, self.cost, self.ran = 0.0, cost, []

    def calls(self) -> dict[str, object]:
        def running(path: str):  # type: ignore[no-untyped-def]
            def run() -> None:
                self.ran.append(path)
                self.now += self.cost[path]

            return run

        return {p: running(p) for p in self.cost}


def drive(choice: MeasuredChoice, clock: Clock, n: int) -> list[str]:
    return [choice.run(clock.calls(), lambda: clock.now) for _ in range(n)]  # type: ignore[arg-type]


def test_the_faster_path_is_kept_after_warmup_and_trials() -> None:
    clock = Clock({"a": 3.0, "b": 1.0})
    seen: list[float] = []
    choice = MeasuredChoice(["a", "b"], lambda t: seen.append(t) or t, recheck_every=100)
    ran = drive(choice, clock, 10)
    # one untimed call each, two timed each, alternating; then the faster one only
    assert ran == ["a", "b", "a", "b", "a", "b", "b", "b", "b", "b"]
    assert seen == [3.0, 1.0, 3.0, 1.0]  # only trials are timed (and go through the ranks' max)
    assert choice.chosen == "b" and choice.history == ["b"]


def test_the_slowest_rank_decides() -> None:
    """Locally "a" is faster, but the all-reduced (slowest rank's) times say "b": every rank
    follows the reduced numbers, so all choose alike."""
    clock = Clock({"a": 1.0, "b": 2.0})
    slowest = {1.0: 5.0, 2.0: 2.0}  # another rank is slow on "a"
    choice = MeasuredChoice(["a", "b"], lambda t: slowest[t])
    drive(choice, clock, 6)
    assert choice.chosen == "b"


def test_trials_repeat_and_follow_a_changed_machine() -> None:
    clock = Clock({"a": 1.0, "b": 2.0})
    choice = MeasuredChoice(["a", "b"], lambda t: t, warmup=0, rounds=1, recheck_every=5)
    ran = drive(choice, clock, 2 + 5)
    assert ran == ["a", "b", "a", "a", "a", "a", "a"] and choice.chosen == "a"
    clock.cost = {"a": 4.0, "b": 2.0}  # the machine changed: "a" got slow
    ran = drive(choice, clock, 2 + 1)
    assert ran == ["a", "b", "b"]
    assert choice.history == ["a", "b"]


def test_no_paths_is_an_error() -> None:
    with pytest.raises(ValueError):
        MeasuredChoice([], lambda t: t)
