"""mpiexec's reports of how ranks ended, and its signs that it could not start them."""

from __future__ import annotations

import pytest

from mnify.launch.launcher_messages import find_launch_problem, parse_launcher_messages
from mnify.launch.ranklines import parse_line
from tests.cli_run.samples import (
    MPICH5_KILLED,
    MPICH_ABORT,
    MPICH_BAD,
    OMPI4_EXIT,
    OMPI4_SIGNAL,
    OMPI5_EXIT,
    OMPI5_SIGNAL,
    OMPI_ABORT,
)


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


def test_mpich_5_reports_a_signal_without_the_rank_and_aborts_with_it() -> None:
    [killed] = parse_launcher_messages(MPICH5_KILLED)
    assert (killed.rank, killed.how, killed.code, killed.detail) == (None, "signal", 9, "Killed")
    [abort] = parse_launcher_messages(MPICH_ABORT)
    assert (abort.rank, abort.how, abort.code) == (1, "abort", 1)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        (
            "ssh: Could not resolve hostname nosuchhost: Name or service not known",
            "host name nosuchhost does not resolve",
        ),
        ("Host key verification failed.", "ssh refused to log in to a host"),
        (
            "ssh: connect to host node3 port 22: Connection refused",
            "ssh could not reach node3: Connection refused",
        ),
        ("PRTE detected a parse error in the hostfile:", "mpiexec could not read the hostfile"),
        (
            "There are not enough slots available in the system to satisfy the 9",
            "the hosts offer fewer slots than ranks",
        ),
        ("A daemon failed to report back after being spawned.", "could not start its daemon"),
    ],
)
def test_launch_problems_are_recognised(text: str, what: str) -> None:
    problem = find_launch_problem(f"some banner\n{text}\nmore")
    assert problem is not None and what in problem.what
    assert problem.hint


def test_a_running_jobs_messages_are_no_launch_problem() -> None:
    assert find_launch_problem(OMPI5_SIGNAL + OMPI_ABORT) is None


def test_rank_tags_of_both_mpis() -> None:
    assert parse_line("[1,3]<stdout>: hi there", "openmpi", "stdout").rank == 3
    assert parse_line("[1,3]<stderr>:x", "openmpi", "stderr").text == "x"
    line = parse_line("[12] loss 0.5", "mpich", "stdout")
    assert (line.rank, line.text) == (12, "loss 0.5")
    untagged = parse_line("prterun noticed that ...", "openmpi", "stderr")
    assert untagged.rank is None
