"""Cutting tracebacks out of rank output, grouping them and classifying the failure."""

from __future__ import annotations

from mnify.launch.failures import FailureKind, group_tracebacks, summarize
from mnify.launch.launcher_messages import parse_launcher_messages
from mnify.launch.rank_reports import RankTraceback, TracebackCollector
from mnify.launch.ranklines import parse_line
from mnify.launch.verdict import render_summary
from mnify.runtime.errors import CollectiveTimeout

PLAIN = [
    "Traceback (most recent call last):",
    '  File "train.py", line 12, in <module>',
    "    main()",
    '  File "train.py", line 9, in main',
    "    raise ValueError('bad lr')",
    "ValueError: bad lr",
]
TIMEOUT_TEXT = str(CollectiveTimeout("allreduce", 3, 0, 2.0, [1]))


def feed_all(collector: TracebackCollector, rank: int, lines: list[str]) -> list[str]:
    shown: list[str] = []
    for line in lines:
        shown += collector.feed(rank, line)
    return shown


def test_plain_traceback_is_held_and_other_lines_pass() -> None:
    c = TracebackCollector()
    shown = feed_all(c, 0, ["epoch 1", *PLAIN, "", "after"])
    assert shown == ["epoch 1", "", "after"]
    [tb] = c.finish()
    assert tb.rank == 0 and tb.lines == PLAIN
    assert tb.exception_line == "ValueError: bad lr"


def test_runtime_header_gives_rank_and_host() -> None:
    c = TracebackCollector()
    assert feed_all(c, 2, ["[mnify] rank 2 (host node7) failed:", *PLAIN]) == []
    [tb] = c.finish()
    assert (tb.rank, tb.host, tb.lines) == (2, "node7", PLAIN)


def test_after_the_header_everything_up_to_a_banner_is_the_report() -> None:
    invalid_type = [
        *PLAIN[:-1],
        "chainer.utils.type_check.InvalidType: ",
        "Invalid operation is performed in: LinearFunction (Forward)",
        "",
        "Expect: x.shape[1] == W.shape[1]",
        "Actual: 784 != 100",
    ]
    c = TracebackCollector()
    lines = ["[mnify] rank 0 (host a) failed:", *invalid_type, "", "-" * 74, "after"]
    assert feed_all(c, 0, lines) == ["-" * 74, "after"]
    [tb] = c.finish()
    assert tb.lines == invalid_type
    assert tb.exception_line == "Actual: 784 != 100"


def test_bare_traceback_ends_at_a_blank_line_after_its_message() -> None:
    c = TracebackCollector()
    shown = feed_all(c, 0, [*PLAIN, "", "retrying with a smaller batch"])
    assert shown == ["", "retrying with a smaller batch"]
    assert c.finish()[0].lines == PLAIN


def test_chained_exceptions_and_multiline_messages_stay_one_block() -> None:
    chained = [
        *PLAIN[:-1],
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        *PLAIN[:-1],
        "RuntimeError: line one",
        "line two of the message",
    ]
    c = TracebackCollector()
    assert feed_all(c, 1, chained) == []
    [tb] = c.finish()
    assert tb.lines == chained
    assert tb.exception_line == "line two of the message"


def test_open_mpi_banner_ends_a_block_and_is_shown() -> None:
    c = TracebackCollector()
    shown = feed_all(c, 0, [*PLAIN, "-" * 74, "MPI_ABORT was invoked on rank 0 in communicator X"])
    assert shown == ["-" * 74, "MPI_ABORT was invoked on rank 0 in communicator X"]
    assert c.finish()[0].lines == PLAIN


def test_interleaved_ranks_are_kept_apart() -> None:
    c = TracebackCollector()
    for a, b in zip(PLAIN, PLAIN, strict=True):
        c.feed(0, a)
        c.feed(1, b)
    tbs = c.finish()
    assert [t.rank for t in tbs] == [0, 1] and all(t.lines == PLAIN for t in tbs)


def test_stale_block_is_released_once() -> None:
    c = TracebackCollector()
    for line in PLAIN:
        c.feed(3, line, now=100.0)
    assert c.stale(now=101.0, hold_seconds=5) == []
    [tb] = c.stale(now=106.0, hold_seconds=5)
    assert tb.shown and tb.lines == PLAIN
    assert c.stale(now=200.0, hold_seconds=5) == []
    assert c.feed(3, "still alive", now=200.0) == ["still alive"]


def test_launcher_frames_are_dropped() -> None:
    lines = [
        PLAIN[0],
        '  File "<frozen runpy>", line 291, in run_path',
        '  File "/v/lib/python3.11/site-packages/mpi4py/run.py", line 53, in run_command_line',
        '    run_path(sys.argv[0], run_name="__main__")',
        *PLAIN[1:],
    ]
    assert RankTraceback(0, lines).text == "\n".join(PLAIN)


def tb(rank: int, lines: list[str]) -> RankTraceback:
    return RankTraceback(rank, list(lines))


def test_identical_tracebacks_collapse_addresses_aside() -> None:
    a = [*PLAIN[:-1], "TypeError: <object at 0x7f3a2b1c0d90> is bad"]
    b = [*PLAIN[:-1], "TypeError: <object at 0x7f00000000aa> is bad"]
    groups = group_tracebacks([tb(2, a), tb(0, b), tb(1, PLAIN)])
    assert [g.ranks for g in groups] == [[0, 2], [1]]


def test_same_error_on_every_rank() -> None:
    s = summarize([tb(r, PLAIN) for r in (2, 0, 1)], 3, 1, rerun_one_rank="mnify run -n 1 t.py")
    assert s.kind is FailureKind.SAME_ON_EVERY_RANK
    text = render_summary(s)
    assert text.count("Traceback (most recent call last)") == 1
    assert "ranks 0-2 (all 3)" in text
    assert "one rank" in s.hint and "mnify run -n 1 t.py" in s.hint


def test_error_on_some_ranks_names_them() -> None:
    s = summarize([tb(1, PLAIN)], 4, 1)
    assert s.kind is FailureKind.SOME_RANKS
    assert "rank 1 (of 4)" in render_summary(s)
    assert "depends on the rank" in s.hint


def test_every_rank_failing_differently_is_rank_dependent() -> None:
    other = [*PLAIN[:-1], "IndexError: shard 1 empty"]
    s = summarize([tb(0, PLAIN), tb(1, other)], 2, 1)
    assert s.kind is FailureKind.DIFFERS_BY_RANK
    assert render_summary(s).count("Traceback (most recent call last)") == 2


def test_watchdog_timeout_alone_is_a_communication_failure() -> None:
    timeout = [*PLAIN[:-1], f"mnify.runtime.errors.CollectiveTimeout: {TIMEOUT_TEXT}"]
    s = summarize([tb(0, timeout)], 2, 1)
    assert s.kind is FailureKind.COMMUNICATION
    assert "allreduce #3 timed out waiting for rank(s) 1" in s.hint
    assert "Retry on one rank" in s.hint
    assert "collective timeout on rank 0 (of 2)" in render_summary(s)


def test_timeouts_of_several_waiting_ranks_collapse() -> None:
    def waiting(rank: int) -> RankTraceback:
        text = str(CollectiveTimeout("allreduce", 3, rank, 2.0, [1]))
        return tb(rank, [*PLAIN[:-1], f"mnify.runtime.errors.CollectiveTimeout: {text}"])

    s = summarize([waiting(0), waiting(2)], 3, 1)
    assert [g.ranks for g in s.errors] == [[0, 2]]
    assert "collective timeout on ranks 0,2 (of 3)" in render_summary(s)


def test_timeouts_after_a_real_error_are_consequences() -> None:
    timeout = [*PLAIN[:-1], f"mnify.runtime.errors.CollectiveTimeout: {TIMEOUT_TEXT}"]
    s = summarize([tb(1, PLAIN), tb(0, timeout)], 2, 1)
    assert s.kind is FailureKind.SOME_RANKS
    assert [g.ranks for g in s.errors] == [[1]]
    assert [g.ranks for g in s.timeouts] == [[0]]
    assert "consequence" in s.hint


OMPI5_SIGNAL = """--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 15613 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------"""
OMPI4_SIGNAL = (
    "mpirun noticed that process rank 0 with PID 0 on node g0034 exited on signal 6 (Aborted)."
)
OMPI5_EXIT = """prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-15629@1,2]
   Exit code:    3"""
OMPI4_EXIT = """mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[12345,1],1]
  Exit code:    7"""
OMPI_ABORT = """MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD
  Proc: [[34922,1],1]
  Errorcode: 4"""
MPICH_BAD = """===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 2 PID 4242 RUNNING AT node3
=   KILLED BY SIGNAL: 9 (Killed)
==================================================================================="""


MPICH5_KILLED = """===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 4462 RUNNING AT vm
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
This typically refers to a problem with your application."""
MPICH_ABORT = (
    "Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1)"
    " - process 1"
)


def test_mpich_5_reports_a_signal_without_the_rank_and_aborts_with_it() -> None:
    [killed] = parse_launcher_messages(MPICH5_KILLED)
    assert (killed.rank, killed.how, killed.code, killed.detail) == (None, "signal", 9, "Killed")
    s = summarize([], 3, 9, MPICH5_KILLED)
    assert "a rank was killed by signal 9 (Killed)" in render_summary(s)
    [abort] = parse_launcher_messages(MPICH_ABORT)
    assert (abort.rank, abort.how, abort.code) == (1, "abort", 1)


def test_mpich_abort_line_ends_a_dying_ranks_report() -> None:
    c = TracebackCollector()
    shown = feed_all(c, 1, ["[mnify] rank 1 (host vm) failed:", *PLAIN, MPICH_ABORT])
    assert shown == [MPICH_ABORT]
    assert c.finish()[0].lines == PLAIN


def test_launcher_messages_of_open_mpi_4_5_and_mpich() -> None:
    assert [(e.rank, e.how, e.code, e.detail) for e in parse_launcher_messages(OMPI5_SIGNAL)] == [
        (1, "signal", 9, "Killed")
    ]
    assert [(e.rank, e.code) for e in parse_launcher_messages(OMPI4_SIGNAL)] == [(0, 6)]
    assert [(e.rank, e.how, e.code) for e in parse_launcher_messages(OMPI5_EXIT)] == [
        (2, "exit", 3)
    ]
    assert [(e.rank, e.how, e.code) for e in parse_launcher_messages(OMPI4_EXIT)] == [
        (1, "exit", 7)
    ]
    assert [(e.rank, e.how, e.code) for e in parse_launcher_messages(OMPI_ABORT)] == [
        (1, "abort", 4)
    ]
    assert [(e.rank, e.how, e.code) for e in parse_launcher_messages(MPICH_BAD)] == [
        (2, "signal", 9)
    ]


def test_killed_rank_without_traceback_is_a_communication_failure_with_memory_hint() -> None:
    s = summarize([], 2, 137, OMPI5_SIGNAL)
    assert s.kind is FailureKind.COMMUNICATION
    assert "signal 9" in s.hint and "memory" in s.hint
    assert "mpiexec: rank 1 was killed by signal 9 (Killed)" in render_summary(s)


def test_what_mpiexec_reported_is_summarised_in_one_line() -> None:
    s = summarize([tb(1, PLAIN)], 3, 1, OMPI_ABORT)
    assert "mpiexec: rank 1 called MPI_Abort (code 4)" in render_summary(s)


def test_plain_non_zero_exit_has_no_traceback_kind() -> None:
    s = summarize([], 3, 3, OMPI5_EXIT)
    assert s.kind is FailureKind.NO_TRACEBACK
    assert "rank 2 exited with status 3" in s.hint


def test_rank_tags_of_both_mpis() -> None:
    assert parse_line("[1,3]<stdout>: hi there", "openmpi", "stdout").rank == 3
    assert parse_line("[1,3]<stderr>:x", "openmpi", "stderr").text == "x"
    line = parse_line("[12] loss 0.5", "mpich", "stdout")
    assert (line.rank, line.text) == (12, "loss 0.5")
    untagged = parse_line("prterun noticed that ...", "openmpi", "stderr")
    assert untagged.rank is None
