"""The failure classifier on fabricated facts: one category per failure, its culprits, precedence.

The same categories are shown end to end, on real ranks, in ``test_run_verdicts.py``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from mnify.launch.diagnosis import Category, JobFacts, diagnose, mismatch_culprits
from mnify.launch.early_exit import StrandedRanks
from mnify.launch.error_groups import group_tracebacks
from mnify.launch.rank_reports import RankExitReport, RankTraceback
from mnify.launch.verdict import as_data, render_text, write_json
from mnify.runtime.errors import CollectiveTimeout
from tests.cli_run.samples import OMPI5_EXIT, OMPI5_SIGNAL, OMPI_ABORT, PLAIN

HEARD = frozenset({0, 1, 2})
ECHO = ["Exception in main training loop: bad lr", *PLAIN[:-1], "Will finalize trainer"]


def tb(rank: int, lines: list[str], **kw: bool) -> RankTraceback:
    return RankTraceback(rank, list(lines), fatal=True, **kw)


def timeout(rank: int, missing: list[int]) -> RankTraceback:
    text = str(CollectiveTimeout("allreduce", 3, rank, 2.0, missing))
    return tb(rank, [*PLAIN[:-1], f"mnify.runtime.errors.CollectiveTimeout: {text}"])


def facts(n: int = 3, status: int = 1, **kw: object) -> JobFacts:
    return JobFacts(nprocs=n, exit_status=status, ranks_heard=HEARD, **kw)  # type: ignore[arg-type]


def test_success_is_ok_even_with_a_handled_traceback() -> None:
    handled = RankTraceback(0, list(PLAIN))  # not fatal: printed and survived
    d = diagnose(facts(status=0, tracebacks=[handled]))
    assert (d.category, d.exit_status, d.culprit_ranks) == (Category.OK, 0, [])


def test_identical_tracebacks_collapse_addresses_aside() -> None:
    a = [*PLAIN[:-1], "TypeError: <object at 0x7f3a2b1c0d90> is bad"]
    b = [*PLAIN[:-1], "TypeError: <object at 0x7f00000000aa> is bad"]
    groups = group_tracebacks([tb(2, a), tb(0, b), tb(1, PLAIN)])
    assert [g.ranks for g in groups] == [[0, 2], [1]]


def test_same_error_on_every_rank_names_all_ranks() -> None:
    d = diagnose(facts(tracebacks=[tb(r, PLAIN) for r in (2, 0, 1)], rerun_one_rank="X"))
    assert (d.category, d.culprit_ranks) == (Category.SAME_ERROR, [0, 1, 2])
    assert "`X`" in d.hint
    assert render_text(d).count("Traceback (most recent call last)") == 1


def test_chainers_echo_and_the_full_traceback_are_one_error() -> None:
    echoes = [tb(r, ECHO, loop_echo=True) for r in range(3)]
    d = diagnose(facts(tracebacks=[*echoes, *(tb(r, PLAIN) for r in range(3))]))
    assert (d.category, [g.ranks for g in d.errors]) == (Category.SAME_ERROR, [[0, 1, 2]])


def test_an_echo_alone_still_counts_for_a_rank_that_printed_nothing_else() -> None:
    d = diagnose(facts(n=2, tracebacks=[tb(0, PLAIN), tb(1, ECHO, loop_echo=True)]))
    assert d.category is Category.RANK_DEPENDENT and len(d.errors) == 2


def test_error_on_some_ranks_names_them() -> None:
    d = diagnose(facts(n=4, tracebacks=[tb(1, PLAIN), tb(3, PLAIN)]))
    assert (d.category, d.culprit_ranks) == (Category.RANK_DEPENDENT, [1, 3])


@pytest.mark.parametrize(
    ("message", "culprits"),
    [
        ("allreduce: rank 0 passed float32(4), ranks 1-2 passed float32(5)", [0]),
        ("allreduce: ranks 0,2 passed float32(4), rank 1 passed float32(5) (op=sum)", [1]),
        ("allreduce: rank 0 passed float32(4), rank 1 passed float32(5)", [1]),  # tie
        ("allreduce: rank 0 passed a, rank 1 passed b, rank 2 passed c", [1, 2]),  # tie
        (
            "ranks entered different collectives: ranks 0-1 entered bcast, rank 2 entered gather",
            [2],
        ),
        ("recv: rank 0 expected an array from rank 1 (tag 0) but rank 1 sent an object", None),
    ],
)
def test_mismatch_culprits_differ_from_the_most_common_signature(
    message: str, culprits: list[int] | None
) -> None:
    assert mismatch_culprits(message) == culprits


def test_debug_mismatch_is_rank_dependent_with_its_culprits() -> None:
    line = "mnify.runtime.errors.CollectiveMismatch: allreduce: rank 0 passed float32(4), "
    mismatch = [*PLAIN[:-1], line + "ranks 1-2 passed float32(5)"]
    d = diagnose(facts(tracebacks=[tb(r, mismatch) for r in range(3)]))
    assert (d.category, d.culprit_ranks) == (Category.RANK_DEPENDENT, [0])


def test_truncated_message_suggests_debug_mode_unless_on() -> None:
    mpi = [*PLAIN[:-1], "mpi4py.MPI.Exception: MPI_ERR_TRUNCATE: message truncated"]
    d = diagnose(facts(tracebacks=[tb(0, mpi)]))
    assert (d.category, d.culprit_ranks) == (Category.RANK_DEPENDENT, [])
    assert "MNIFY_DEBUG=1" in d.hint
    assert (
        "MNIFY_DEBUG=1 mnify run" not in diagnose(facts(tracebacks=[tb(0, mpi)], debug=True)).hint
    )


def test_watchdog_timeout_alone_names_the_ranks_that_never_arrived() -> None:
    d = diagnose(facts(tracebacks=[timeout(0, [1]), timeout(2, [1])]))
    assert (d.category, d.culprit_ranks) == (Category.COMMUNICATION, [1])
    assert [g.ranks for g in d.errors] == [[0, 2]]
    assert "timed out waiting for rank(s) 1" in d.hint


def test_timeouts_after_a_real_error_are_consequences() -> None:
    d = diagnose(facts(n=2, tracebacks=[tb(1, PLAIN), timeout(0, [1])]))
    assert (d.category, d.culprit_ranks) == (Category.RANK_DEPENDENT, [1])
    assert [g.ranks for g in d.consequences] == [[0]]


def test_rank_exit_reported_by_the_bootstrap() -> None:
    report = RankExitReport(1, "vm", 3)
    d = diagnose(facts(n=2, status=3, exit_reports=[report], launcher_text=OMPI_ABORT))
    assert (d.category, d.culprit_ranks, d.exit_status) == (Category.RANK_EXITED, [1], 3)


def test_rank_exit_reported_by_mpiexec_only() -> None:
    d = diagnose(facts(status=3, launcher_text=OMPI5_EXIT))
    assert (d.category, d.culprit_ranks) == (Category.RANK_EXITED, [2])


def test_stranded_ranks_take_the_leavers_status() -> None:
    stranded = StrandedRanks({1: 0}, [0, 2], "allreduce", 4, 3.0)
    d = diagnose(facts(status=143, stranded=stranded, launcher_text=OMPI5_SIGNAL))
    assert (d.category, d.culprit_ranks, d.exit_status) == (Category.RANK_EXITED, [1], 1)
    assert as_data(d)["waiting_ranks"] == [0, 2]


def test_killed_rank_has_the_memory_hint() -> None:
    d = diagnose(facts(n=2, status=137, launcher_text=OMPI5_SIGNAL, tracebacks=[timeout(0, [1])]))
    assert (d.category, d.culprit_ranks) == (Category.KILLED, [1])
    assert "memory" in d.hint and [g.ranks for g in d.consequences] == [[0]]


def test_launch_failure_before_any_rank_started() -> None:
    text = "ssh: Could not resolve hostname nosuchhost: Name or service not known"
    d = diagnose(JobFacts(nprocs=2, exit_status=255, launcher_text=text))
    assert (d.category, d.culprit_ranks) == (Category.LAUNCH, [])
    silent = diagnose(JobFacts(nprocs=2, exit_status=1))
    assert silent.category is Category.LAUNCH


def test_a_daemon_lost_after_every_rank_ran_is_no_launch_failure() -> None:
    text = "A daemon failed to report back after being spawned."
    d = diagnose(facts(n=4, launcher_text=text, tracebacks=[timeout(0, [2, 3])]))
    d4 = diagnose(
        JobFacts(4, 1, [timeout(0, [2, 3])], launcher_text=text, ranks_heard=frozenset(range(4)))
    )
    assert d.category is Category.LAUNCH  # rank 3 never printed: it may never have started
    assert (d4.category, d4.culprit_ranks) == (Category.COMMUNICATION, [2, 3])


def test_interrupted_exits_128_plus_the_signal() -> None:
    d = diagnose(facts(status=143, interrupted_by=signal.SIGTERM, tracebacks=[tb(0, PLAIN)]))
    assert (d.category, d.exit_status, d.culprit_ranks) == (Category.INTERRUPTED, 143, [])


def test_precedence_launch_killed_error_exit_communication() -> None:
    launch = "ssh: Could not resolve hostname x: no"
    error, timed = tb(0, PLAIN), timeout(2, [1])
    exited = RankExitReport(1, "vm", 3)
    everything = facts(
        launcher_text=f"{launch}\n{OMPI5_SIGNAL}", tracebacks=[error, timed], exit_reports=[exited]
    )
    everything.ranks_heard = frozenset({0, 2})  # rank 1 never started
    order = [Category.LAUNCH, Category.KILLED, Category.RANK_DEPENDENT, Category.RANK_EXITED]
    cases = [
        everything,
        facts(launcher_text=OMPI5_SIGNAL, tracebacks=[error, timed], exit_reports=[exited]),
        facts(tracebacks=[error, timed], exit_reports=[exited]),
        facts(tracebacks=[timed], exit_reports=[exited]),
    ]
    assert [diagnose(f).category for f in cases] == order
    assert diagnose(facts(tracebacks=[timed])).category is Category.COMMUNICATION


def test_summary_json_schema_and_first_line(tmp_path: Path) -> None:
    d = diagnose(facts(n=2, tracebacks=[tb(1, PLAIN)]))
    path = tmp_path / "verdict.json"
    write_json(path, d)
    data = json.loads(path.read_text())
    assert {k: data[k] for k in ("schema", "exit_status", "category", "culprit_ranks")} == {
        "schema": 1,
        "exit_status": 1,
        "category": "rank-dependent",
        "culprit_ranks": [1],
    }
    assert data["errors"] == [
        {"type": "ValueError", "message": "bad lr", "ranks": [1], "hosts": []}
    ]
    assert data["hint"] == d.hint
    assert render_text(d).splitlines()[0] == (
        "mnify run: the job failed (exit status 1): rank-dependent: rank 1 of 2 failed"
    )


def test_a_killed_launcher_is_the_cause_and_no_rank_is_blamed() -> None:
    d = diagnose(facts(status=137, launcher_signal=signal.SIGKILL, vanished=[0, 1, 2]))
    assert (d.category, d.culprit_ranks) == (Category.KILLED, [])
    assert d.headline == "the launcher was killed by signal 9 (SIGKILL)"


def test_a_rank_error_still_wins_over_the_launcher_dying_after_it() -> None:
    d = diagnose(facts(status=139, launcher_signal=11, tracebacks=[tb(1, PLAIN)]))
    assert (d.category, d.culprit_ranks) == (Category.RANK_DEPENDENT, [1])


def test_a_rank_that_vanished_without_a_word_is_killed() -> None:
    d = diagnose(facts(status=137, vanished=[2], launcher_outlived_ranks=True))
    assert (d.category, d.culprit_ranks) == (Category.KILLED, [2])
    assert "mnify run ended it" in d.hint  # the launcher hung and was ended


def test_a_hung_launcher_after_ranks_that_all_ended_well_is_a_success() -> None:
    ended_well = {0: 0, 1: 0, 2: 0}
    d = diagnose(facts(status=137, launcher_outlived_ranks=True, exit_statuses=ended_well))
    assert (d.category, d.exit_status) == (Category.OK, 0)
    d = diagnose(facts(status=137, launcher_outlived_ranks=True, exit_statuses={0: 0, 1: 0}))
    assert d.category is not Category.OK  # rank 2 never reached its end


def test_a_rank_that_left_while_others_waited_is_the_verdict_even_when_they_timed_out() -> None:
    """Under --watchdog the waiting ranks time out before --exit-timeout ends the job: the
    rank that left is still the cause, the timeouts its consequence."""
    left = StrandedRanks(exited={1: 0}, waiting=[0, 2], kind="allreduce", seq=3, seconds=1.5)
    d = diagnose(facts(left_early=left, tracebacks=[timeout(0, [1]), timeout(2, [1])]))
    assert (d.category, d.culprit_ranks) == (Category.RANK_EXITED, [1])
    assert as_data(d)["waiting_ranks"] == [0, 2]
    assert [g.ranks for g in d.consequences] == [[0, 2]]
