"""Cutting the ranks' reports out of their stderr: tracebacks, exit lines, Chainer's echo."""

from __future__ import annotations

from mnify.launch.rank_reports import (
    LOOP_ECHO_END,
    RankTraceback,
    TracebackCollector,
    exit_report_line,
    fold_runtime_frames,
)
from tests.cli_run.samples import MPICH_ABORT, PLAIN


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


def test_mpich_abort_line_ends_a_dying_ranks_report() -> None:
    c = TracebackCollector()
    shown = feed_all(c, 1, ["[mnify] rank 1 (host vm) failed:", *PLAIN, MPICH_ABORT])
    assert shown == [MPICH_ABORT]
    assert c.finish()[0].lines == PLAIN


def test_exit_line_is_a_report_not_output() -> None:
    c = TracebackCollector()
    line = exit_report_line(1, "node2", 3, "bad config")
    assert c.feed(1, line) == []
    [report] = c.exits
    assert (report.rank, report.host, report.status, report.message) == (
        1,
        "node2",
        3,
        "bad config",
    )
    assert c.finish() == []


CHAINER_ECHO = [
    "Exception in main training loop: bad lr",
    "Traceback (most recent call last):",
    '  File "/v/chainer/training/trainer.py", line 346, in run',
    "    entry.extension(self)",
    '  File "train.py", line 22, in __call__',
    "    raise ValueError('bad lr')",
    LOOP_ECHO_END,
]


def test_chainers_training_loop_echo_is_held_as_its_own_block() -> None:
    c = TracebackCollector()
    assert feed_all(c, 0, [*CHAINER_ECHO, "[mnify] rank 0 (host a) failed:", *PLAIN]) == []
    echo, final = c.finish()
    assert echo.loop_echo and echo.lines == CHAINER_ECHO
    assert (echo.error_type, echo.error_message) == ("", "bad lr")
    assert not final.loop_echo and final.fatal and final.lines == PLAIN


def test_runtime_frames_fold_into_one_line_naming_entry_and_failure() -> None:
    lines = [
        PLAIN[0],
        '  File "train.py", line 3, in <module>',
        "    comm.allreduce(x)",
        '  File "/v/mnify/runtime/communicators/base.py", line 361, in allreduce',
        "    self._allreduce_into(buf, buf, mpi_op)",
        '  File "/v/mnify/runtime/watchdog.py", line 149, in _poll',
        "    raise self.timeout_error()",
        "    ^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "mnify.runtime.errors.CollectiveTimeout: collective allreduce #3 timed out",
    ]
    assert fold_runtime_frames(lines) == [
        *lines[:3],
        "  [2 frames inside mnify.runtime: allreduce … _poll]",
        lines[-1],
    ]


def test_exception_type_and_message_with_notes() -> None:
    tb = RankTraceback(0, [*PLAIN[:-1], "pkg.errors.Boom: first line", "second line"])
    assert (tb.error_type, tb.error_message) == ("pkg.errors.Boom", "first line\nsecond line")
    bare = RankTraceback(0, [*PLAIN[:-1], "KeyboardInterrupt"])
    assert (bare.error_type, bare.error_message) == ("KeyboardInterrupt", "")
