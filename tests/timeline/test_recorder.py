"""The per-rank recorder on its own (one process, no MPI): layout, ring, updates, kills, GPU spans,
and which communicator methods the hooks wrap."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mnify import environment
from mnify.runtime import observers, timeline
from mnify.runtime.timeline import Category, Recorder, TimelineFileError, read_file

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_000_000

    def __call__(self) -> int:
        self.t += 1000
        return self.t


def make(tmp_path: Path, capacity: int = 64, rank: int = 0) -> Recorder:
    return Recorder(
        tmp_path / f"rank-{rank}.timeline", rank=rank, size=2, host="h", capacity=capacity,
        now=FakeClock(),
    )  # fmt: skip


def test_events_read_back_with_their_fields(tmp_path: Path) -> None:
    rec = make(tmp_path)
    name = rec.name_id("allreduce")
    at = rec.open(Category.COLLECTIVE, name, 3, 7, 4096, -1)
    inner = rec.open(Category.BUCKET, rec.name_id("bucket"), 3, 1, 1024, 7)
    rec.close(inner)
    rec.flag(at, timeline.FLAG_ERROR)
    rec.close(at)
    got = read_file(rec.path)
    assert (got.rank, got.size, got.host, got.written, got.damaged) == (0, 2, "h", 2, 0)
    outer, bucket = got.events
    assert (outer.name, outer.cat, outer.comm, outer.seq, outer.nbytes) == (
        "allreduce", Category.COLLECTIVE, 3, 7, 4096,
    )  # fmt: skip
    assert outer.flags & timeline.FLAG_ERROR and not bucket.flags
    assert outer.end is not None and bucket.end is not None
    assert outer.start < bucket.start < bucket.end < outer.end
    assert (bucket.name, bucket.seq, bucket.aux) == ("bucket", 1, 7)
    assert not got.exited
    rec.finish()
    assert read_file(rec.path).exited


def test_the_ring_keeps_the_newest_events(tmp_path: Path) -> None:
    rec = make(tmp_path, capacity=16)
    name = rec.name_id("barrier")
    ats = []
    for seq in range(1, 41):
        ats.append(rec.open(Category.COLLECTIVE, name, 0, seq, 0, -1))
        rec.close(ats[-1])
    got = read_file(rec.path)
    assert got.written == 40 and got.capacity == 16
    # the oldest slot of a wrapped ring is not trusted (a killed writer may have been in it)
    assert [e.seq for e in got.events] == list(range(26, 41))
    # closing an event the ring has overwritten leaves the newer record alone
    rec.close(ats[0])
    again = read_file(rec.path)
    assert [e.end for e in again.events] == [e.end for e in got.events]


def test_an_open_event_reads_as_unfinished(tmp_path: Path) -> None:
    rec = make(tmp_path)
    rec.open(Category.COLLECTIVE, rec.name_id("multi_node_mean_grad"), 0, 1, 0, -1)
    (event,) = read_file(rec.path).events
    assert event.end is None


def test_a_killed_writer_leaves_its_completed_events_and_the_open_one(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.timeline"
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from mnify.runtime.timeline import Category, Recorder
        rec = Recorder(Path({str(path)!r}), rank=0, size=1, host="h", capacity=64)
        name = rec.name_id("allreduce")
        for seq in range(1, 101):
            rec.close(rec.open(Category.COLLECTIVE, name, 0, seq, 8, -1))
        rec.open(Category.COLLECTIVE, name, 0, 101, 8, -1)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60)
    assert proc.returncode == -9
    got = read_file(path)
    assert not got.exited and got.written == 101
    assert [e.seq for e in got.events] == list(range(39, 102))
    assert all(e.end is not None for e in got.events[:-1]) and got.events[-1].end is None


def test_updates_count_steps_and_nest_the_apply(tmp_path: Path) -> None:
    rec = make(tmp_path)
    for _ in range(3):
        rec.update_begins()
        rec.close(rec.open(Category.COLLECTIVE, rec.name_id("multi_node_mean_grad"), 0, 1, 0, -1))
        rec.apply_begins()
        rec.update_ends()
    rec.update_begins()  # an update that raised before its end
    rec.update_begins()
    rec.update_ends()
    events = read_file(rec.path).events
    updates = [e for e in events if e.cat == Category.UPDATE]
    applies = [e for e in events if e.cat == Category.APPLY]
    grads = [e for e in events if e.cat == Category.COLLECTIVE]
    assert [e.step for e in updates] == [0, 1, 2, 3, 4]
    assert [e.step for e in grads] == [0, 1, 2] and [e.step for e in applies] == [0, 1, 2]
    assert [bool(e.flags & timeline.FLAG_SKIPPED) for e in updates] == [0, 0, 0, 1, 0]
    for u, a, g in zip(updates, applies, grads, strict=False):
        assert u.start < g.start and g.end is not None and g.end <= a.start
        assert a.end is not None and u.end is not None and a.end <= u.end
    assert rec.step == 5


def test_metadata_survives_and_overflow_is_counted(tmp_path: Path) -> None:
    rec = make(tmp_path)
    rec.meta({"t": "comm", "id": 0, "key": "abc.0", "size": 2, "rank": 0})
    rec.meta({"t": "clock", "comm": 0, "ref": 0, "offset_ns": 5, "rtt_ns": 10, "at_ns": 1})
    big = {"t": "warning", "message": "x" * (timeline.META_BYTES + 1)}
    rec.meta(big)
    got = read_file(rec.path)
    assert got.comms[0]["key"] == "abc.0" and got.clocks[0]["offset_ns"] == 5
    assert got.dropped_meta == 1 and got.process["size"] == 2


def test_unreadable_files_say_why(tmp_path: Path) -> None:
    short = tmp_path / "rank-0.timeline"
    short.write_bytes(b"\0" * 100)
    with pytest.raises(TimelineFileError, match="too short"):
        read_file(short)
    bad = tmp_path / "rank-1.timeline"
    bad.write_bytes(b"\1" * (timeline.HEADER_BYTES + timeline.META_BYTES + 960))
    with pytest.raises(TimelineFileError, match="not a timeline"):
        read_file(bad)
    with pytest.raises(TimelineFileError):
        read_file(tmp_path / "absent.timeline")
    assert timeline.rank_of_file(Path("rank-12.timeline")) == 12
    assert timeline.rank_of_file(Path("rank-x.timeline")) is None


# -- GPU spans, with a stand-in for cupy.cuda ----------------------------------------------------


class FakeCuda:
    """Events complete when the test says the device got there; the device clock runs 5 ms
    behind the host's."""

    def __init__(self, host: FakeClock) -> None:
        self.host = host
        self.device_now = 0
        cuda = self

        class Event:
            def __init__(self, block: bool = False) -> None:
                self.at: int | None = None
                self.stream: Any = None

            def record(self, stream: Any = None) -> None:
                self.stream = stream
                # an idle stream runs at once; others when the test advances the device
                self.at = cuda.host.t - 5_000_000 if stream is cuda.idle else None
                cuda.queue.append(self)

            @property
            def done(self) -> bool:
                return self.at is not None

            def synchronize(self) -> None:
                assert self.at is not None

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                cuda.idle = self

        self.Event, self.Stream = Event, Stream
        self.queue: list[Any] = []
        self.idle: Any = None

    def run_queue(self, start_ns: int, step_ns: int) -> None:
        """The device executes everything recorded so far, ``step_ns`` apart from ``start_ns``
        (device clock)."""
        t = start_ns
        for event in self.queue:
            if event.at is None:
                event.at = t
                t += step_ns
        self.queue = [e for e in self.queue if e.at is None]

    @staticmethod
    def get_elapsed_time(a: Any, b: Any) -> float:
        return (b.at - a.at) / 1e6


def test_device_spans_land_on_the_host_clock_once_the_gpu_passed_them(tmp_path: Path) -> None:
    clock = FakeClock()
    rec = Recorder(tmp_path / "rank-0.timeline", rank=0, size=1, host="h", capacity=64, now=clock)
    cuda = FakeCuda(clock)
    spans = timeline.DeviceSpans(rec, cuda)
    anchor_device, anchor_host = spans._ref.at, spans._ref_ns
    name = rec.name_id("multi_node_mean_grad")
    started = spans.begin(None)
    spans.end(started, None, Category.COLLECTIVE, name, 0, 4, 1 << 20)
    spans.poll()
    assert not [e for e in read_file(rec.path).events if e.cat == Category.DEVICE]
    cuda.run_queue(anchor_device + 2_000_000, 3_000_000)  # begins 2 ms after the anchor, 3 ms
    spans.poll()
    (span,) = [e for e in read_file(rec.path).events if e.cat == Category.DEVICE]
    assert span.start == anchor_host + 2_000_000 and span.end == anchor_host + 5_000_000
    assert (span.name, span.aux, span.seq, span.nbytes) == (
        "multi_node_mean_grad", int(Category.COLLECTIVE), 4, 1 << 20,
    )  # fmt: skip


def test_pending_device_spans_are_bounded(tmp_path: Path) -> None:
    clock = FakeClock()
    rec = Recorder(tmp_path / "rank-0.timeline", rank=0, size=1, host="h", capacity=64, now=clock)
    spans = timeline.DeviceSpans(rec, FakeCuda(clock))
    spans.MAX_PENDING = 3
    for _ in range(5):
        spans.end(spans.begin(None), None, Category.PACK, rec.name_id("pack"), 0, 1, 8)
    assert len(spans._pending) == 3 and read_file(rec.path).dropped_device == 2


# -- what the communicators publish ----------------------------------------------------------


def _entering_methods() -> dict[str, str]:
    """Public communicator methods that enter a collective (``self._enter``) or a
    point-to-point call (``self._enter_p2p``)."""
    found: dict[str, str] = {}
    for path in sorted((REPO / "mnify/runtime/communicators").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                if fn.name.startswith("_"):
                    continue
                for node in ast.walk(fn):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "self"
                        and node.func.attr in ("_enter", "_enter_p2p")
                    ):
                        found[fn.name] = node.func.attr
    return found


def test_every_collective_and_point_to_point_method_publishes() -> None:
    from mnify.runtime.communicators import NAMES, communicator_class
    from mnify.runtime.communicators.base import CommunicatorBase
    from mnify.runtime.communicators.marks import collective_names
    from mnify.runtime.observers import point_to_point_names

    entering = _entering_methods()
    assert entering, "no communicator method enters a collective: the scan is broken"
    classes = [CommunicatorBase, *(communicator_class(n) for n in NAMES if n != "auto")]
    for cls in classes:
        collectives, p2p = collective_names(cls), point_to_point_names(cls)
        assert p2p == {"recv", "recv_obj", "send", "send_obj", "start_exchange"}
        for name, how in entering.items():
            if not hasattr(cls, name):
                continue
            wanted = p2p if how == "_enter_p2p" else collectives
            assert name in wanted, f"{cls.__name__}.{name} enters a collective, publishes nothing"


class _Everything(observers.Observer):
    """Counts what is published."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def collective_enters(self, comm: Any, kind: str, seq: int, nbytes: int, *rest: Any) -> None:
        self.seen.append(f"{kind}#{seq}:{nbytes}")

    def bucket_begins(self, nbytes: int) -> None:
        self.seen.append("bucket")

    def kernel_begins(self, kind: str, buffer: Any) -> None:
        self.seen.append(kind)


def test_without_the_variable_nothing_is_installed_or_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    from mnify.runtime import kernels
    from mnify.runtime.communicators import create_communicator
    from mnify.runtime.communicators.marks import collective_names

    monkeypatch.delenv(environment.TIMELINE.name, raising=False)
    pack = kernels.pack
    comm = create_communicator("flat")
    try:
        comm.allreduce(np.ones(4, dtype=np.float32))
        names = {*collective_names(type(comm)), "send", "recv", "_allreduce_into"}
        assert not set(vars(comm)) & names  # no instance attribute shadows a method
        assert kernels.pack is pack and timeline.recorder() is None
        assert observers.subscribers() == () and not timeline.observes(comm)
        # what a subscriber would have been told: the same calls publish once one is there
        seen = _Everything()
        unsubscribe = observers.subscribe(seen)
        try:
            comm.allreduce(np.ones(4, dtype=np.float32))
        finally:
            unsubscribe()
        assert seen.seen == [f"allreduce#{comm._seq}:16", "bucket"]
        assert observers.subscribers() == ()
    finally:
        comm.finalize()
