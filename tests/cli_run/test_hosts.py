"""Hostfiles (Open MPI and MPICH dialects), --host lists and core counting."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnify.launch.hosts import (
    HostSlots,
    HostSpecError,
    parse_host_list,
    parse_hostfile,
    parse_hostfile_text,
    physical_cores,
    total_slots,
)


def test_open_mpi_hostfile_with_comments_and_repeats() -> None:
    text = "# cluster\nnode1 slots=4\nnode2 slots=4 max_slots=8  # gpu\n\nnode3\nnode1 slots=2\n"
    hosts = parse_hostfile_text(text)
    assert hosts == [HostSlots("node1", 6), HostSlots("node2", 4), HostSlots("node3", None)]
    assert total_slots(hosts) is None
    assert total_slots(hosts[:2]) == 10


def test_mpich_hostfile_dialect() -> None:
    assert parse_hostfile_text("a:2\nb:3\n") == [HostSlots("a", 2), HostSlots("b", 3)]


@pytest.mark.parametrize("text", ["", "# only a comment\n", "node1 slots=x\n", "node1:0\n"])
def test_bad_hostfiles_are_errors(text: str) -> None:
    with pytest.raises(HostSpecError):
        parse_hostfile_text(text)


def test_missing_hostfile_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HostSpecError, match="cannot read hostfile"):
        parse_hostfile(tmp_path / "nope")


def test_host_list() -> None:
    assert parse_host_list("n1:4,n2:4") == [HostSlots("n1", 4), HostSlots("n2", 4)]
    assert parse_host_list("n1") == [HostSlots("n1", None)]
    for bad in ("", ":4", "n1:zero"):
        with pytest.raises(HostSpecError):
            parse_host_list(bad)


def test_physical_cores_is_within_the_cpus_we_may_use() -> None:
    import os

    assert 1 <= physical_cores() <= len(os.sched_getaffinity(0))
