"""The ranks' published states and the launcher's rule for ending a job a rank has left."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnify import environment
from mnify.environment import LaunchWiring
from mnify.launch.early_exit import EarlyExitWatch
from mnify.runtime import observers, rank_state
from mnify.runtime.rank_state import Phase, StateFile, read_record, record_path


@pytest.fixture
def published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    wiring = LaunchWiring(rank_state_dir=str(tmp_path), rank_state_host=socket.gethostname())
    monkeypatch.setenv(environment.LAUNCH.name, wiring.to_text())
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    yield tmp_path
    rank_state.stop()


def test_a_rank_publishes_entering_waiting_and_exiting(published: Path) -> None:
    assert rank_state.start()
    path = record_path(published, 2)
    record = read_record(path, 2)
    assert record is not None and (record.phase, record.pid) == (Phase.RUNNING, os.getpid())
    # what a communicator publishes when it enters collective 7 and waits in MPI
    (publisher,) = observers.subscribers()
    publisher.collective_enters(None, "allreduce", 7, 0, (), {})
    observers.wait_begins()
    record = read_record(path, 2)
    assert record is not None
    assert (record.phase, record.kind, record.seq, record.waits) == (
        Phase.WAITING,
        "allreduce",
        7,
        1,
    )
    observers.wait_ends()
    rank_state.exiting(3)
    record = read_record(path, 2)
    assert record is not None and (record.phase, record.status) == (Phase.EXITING, 3)


def test_nothing_is_published_for_another_host(
    published: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = LaunchWiring(rank_state_dir=str(published), rank_state_host="some-other-host")
    monkeypatch.setenv(environment.LAUNCH.name, elsewhere.to_text())
    assert not rank_state.start()
    observers.wait_begins()  # nobody subscribed: nothing is written
    assert list(published.iterdir()) == [] and observers.subscribers() == ()


def records(tmp_path: Path, n: int) -> list[StateFile]:
    return [StateFile(record_path(tmp_path, r)) for r in range(n)]


def test_a_wait_overlapping_an_exit_for_the_timeout_strands_the_waiter(tmp_path: Path) -> None:
    r0, r1, r2 = records(tmp_path, 3)
    watch = EarlyExitWatch(tmp_path, 3, exit_timeout=3)
    r0.entered("allreduce", 5)
    r0.wait_begins()
    assert watch.poll(100.0) is None  # waiting, but nobody has left
    r1.exiting(0)
    assert watch.poll(101.0) is None
    assert watch.poll(103.5) is None  # 2.5 s of overlap
    stranded = watch.poll(104.0)
    assert stranded is not None
    assert (stranded.exited, stranded.waiting, stranded.kind, stranded.seq) == (
        {1: 0},
        [0],
        "allreduce",
        5,
    )
    assert watch.started() == {0, 1, 2}


def test_waits_that_complete_and_local_work_are_never_stranded(tmp_path: Path) -> None:
    r0, r1 = records(tmp_path, 2)
    watch = EarlyExitWatch(tmp_path, 2, exit_timeout=3)
    r1.exiting(0)
    watch.poll(100.0)
    for t in range(101, 110):  # rank 0 keeps doing short collectives, or works alone
        r0.wait_begins()
        assert watch.poll(float(t)) is None
        r0.wait_ends()
    assert watch.poll(200.0) is None
    r0.wait_begins()  # then enters one that never completes
    assert watch.poll(201.0) is None
    assert watch.poll(204.0) is not None


def test_exit_timeout_zero_turns_the_rule_off(tmp_path: Path) -> None:
    r0, r1 = records(tmp_path, 2)
    watch = EarlyExitWatch(tmp_path, 2, exit_timeout=0)
    r0.wait_begins()
    r1.exiting(0)
    assert watch.poll(0.0) is None and watch.poll(1e6) is None
