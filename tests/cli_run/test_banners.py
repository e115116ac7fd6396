"""Open MPI's boxes about how a job ended stay out of the live output; other boxes pass."""

from __future__ import annotations

from mnify.launch.banners import BannerFilter
from mnify.launch.diagnosis import FORK_NOTE, JobFacts, diagnose

RULE = "-" * 74
ABORT_BOX = [
    RULE,
    "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD",
    "  Proc: [[18507,1],1]",
    "  Errorcode: 1",
    "",
    "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.",
    RULE,
]
FORK_BOX = [
    RULE,
    "A process has executed an operation involving a call to the",
    '"fork()" system call to create a child process.  Open MPI is currently',
    "operating in a condition that could result in memory corruption or",
    RULE,
]


def feed(f: BannerFilter, source: int | None, lines: list[str]) -> list[str]:
    return [shown for line in lines for shown in f.feed(source, line)]


def test_abort_box_and_the_stray_blank_after_it_are_dropped() -> None:
    f = BannerFilter()
    assert feed(f, 1, ["before", *ABORT_BOX, " ", "after"]) == ["before", "after"]


def test_other_boxes_pass_whole_and_sources_do_not_mix() -> None:
    f = BannerFilter()
    shown = []
    for a, b in zip(FORK_BOX, ABORT_BOX, strict=False):
        shown += f.feed(None, a)
        shown += f.feed(0, b)
    shown += feed(f, 0, ABORT_BOX[len(FORK_BOX) :])
    assert shown == FORK_BOX


def test_mpich_boxes_and_abort_line_are_dropped() -> None:
    f = BannerFilter()
    box = ["=" * 83, "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "=" * 83]
    abort = "Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort(...)"
    assert feed(f, None, [*box, "after"]) == ["after"]
    assert feed(f, 1, [abort, "next"]) == ["next"]


def test_unclosed_box_is_flushed_at_the_end() -> None:
    f = BannerFilter()
    assert feed(f, None, [RULE, "half a message"]) == []
    assert f.flush() == [(None, RULE), (None, "half a message")]


def test_fork_warning_reaches_the_hint() -> None:
    warned = diagnose(JobFacts(nprocs=2, exit_status=134, launcher_text="\n".join(FORK_BOX)))
    assert FORK_NOTE in warned.hint
    assert FORK_NOTE not in diagnose(JobFacts(2, 1, launcher_text="nothing")).hint
