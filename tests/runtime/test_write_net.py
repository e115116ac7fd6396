"""The write net without ranks: which files are named (judge), how (render), what a rank records
(its audit hook, called here by hand: a hook installed in the test process could never be
removed), and how rank 0's JSON line reaches ``mnify run``. The real 2-rank runs are in
tests/cli_run/test_write_net_run.py."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mnify.cli.run import write_net_outcome
from mnify.launch.rank_reports import WRITE_NET_PREFIX, TracebackCollector
from mnify.runtime import write_net
from mnify.runtime.file_writes import WriteFilter
from mnify.runtime.write_net import (
    NetReport,
    SharedWrite,
    WriteRecord,
    audit_hook,
    judge,
    render,
)

CWD = "/job"


def _files(**by_rank: dict[str, str]) -> dict[int, dict[str, str]]:
    return {int(rank[1:]): files for rank, files in by_rank.items()}


def test_a_file_two_ranks_wrote_is_named_with_the_ranks_after_the_first() -> None:
    found = judge(
        _files(
            r0={"/job/result/model.json": "train.py:51 -> nets.py:77"},
            r1={"/job/result/model.json": "train.py:51 -> nets.py:77"},
            r2={"/job/result/model.json": "train.py:51 -> nets.py:77"},
        ),
        CWD,
    )
    assert found == [
        SharedWrite("result/model.json", [1, 2], "train.py:51 -> nets.py:77", "same-file")
    ]


def test_a_file_only_other_ranks_wrote_names_all_but_the_first() -> None:
    found = judge(_files(r0={}, r1={"/job/a.txt": "t.py:3"}, r2={"/job/a.txt": "t.py:4"}), CWD)
    assert found == [SharedWrite("a.txt", [2], "t.py:4", "same-file")]


def test_a_file_of_its_own_beside_rank_0s_files_is_named_elsewhere_not() -> None:
    found = judge(
        _files(
            r0={"/job/result/log": "train.py:40", "/job/result/run-100.txt": "train.py:58"},
            r1={"/job/result/run-101.txt": "train.py:58", "/scratch/r/cache.bin": "train.py:9"},
        ),
        CWD,
    )
    assert found == [
        SharedWrite("result/run-101.txt", [1], "train.py:58", "rank-0-directory"),
    ]


@pytest.mark.parametrize(
    ("theirs", "mine"),
    [
        ("/job/out/loss_0.txt", "/job/out/loss_1.txt"),  # the rank where rank 0 has its own
        ("/job/out/log", "/job/out/times_rank1.json"),  # the word says it
        ("/job/out/log", "/job/out/worker-1.log"),
        ("/job/out/log", "/job/out/Rank_1_of_2.csv"),
    ],
)
def test_files_named_for_their_rank_are_not_named(theirs: str, mine: str) -> None:
    assert judge(_files(r0={theirs: "t.py:1"}, r1={mine: "t.py:2"}), CWD) == []


@pytest.mark.parametrize(
    ("theirs", "mine"),
    [
        ("/job/out/epoch_0.txt", "/job/out/epoch_10.txt"),  # 10 is not rank 1
        ("/job/out/log", "/job/out/model_1.npz"),  # a 1 with no rank-0 twin
        ("/job/out/a_0.txt", "/job/out/b_1.txt"),  # a different name around the rank
    ],
)
def test_a_number_that_is_not_the_rank_does_not_excuse_a_file(theirs: str, mine: str) -> None:
    [found] = judge(_files(r0={theirs: "t.py:1"}, r1={mine: "t.py:2"}), CWD)
    assert (found.ranks, found.kind) == ([1], "rank-0-directory")


def test_paths_outside_the_working_directory_stay_absolute() -> None:
    [found] = judge(_files(r0={"/data/x.npz": "t.py:1"}, r1={"/data/x.npz": "t.py:1"}), CWD)
    assert found.path == "/data/x.npz"


def test_render_says_the_issue_s_line_and_folds_one_site_s_files() -> None:
    report = NetReport(
        [
            SharedWrite(
                "result/model_structure.json", [1], "train.py:51 -> nets.py:77", "same-file"
            ),
            SharedWrite("result/snapshot_iter_4", [1, 2, 3], "train.py:60", "same-file"),
            SharedWrite("result/snapshot_iter_8", [1, 2, 3], "train.py:60", "same-file"),
            SharedWrite("result/snapshot_iter_12", [1, 2, 3], "train.py:60", "same-file"),
            SharedWrite("result/run-101.txt", [1], "train.py:58", "rank-0-directory"),
        ],
        missing_ranks=[3],
        left_ranks=[4],
    )
    assert render(report) == [
        "mnify: rank 1 also wrote result/model_structure.json (train.py:51 -> nets.py:77): "
        "guard it with if comm.rank == 0",
        "mnify: ranks 1-3 also wrote result/snapshot_iter_4 and 2 more files like it "
        "(train.py:60): guard it with if comm.rank == 0",
        "mnify: rank 1 wrote result/run-101.txt beside rank 0's files in result (train.py:58): "
        "guard it with if comm.rank == 0, or put the rank in its name",
        "mnify: the write net did not see the files of rank 4: it left before rank 0 ended "
        "(more than MNIFY_EXIT_BARRIER seconds earlier)",
        f"mnify: the write net heard nothing from rank 3 at exit within "
        f"{write_net.EXCHANGE_SECONDS:g} s: their writes are not in the lines above",
    ]
    assert render(NetReport()) == []


# -- what a rank records ----------------------------------------------------------------------


def _in_a_thread(fn: Any, *args: Any) -> None:
    """Run ``fn`` where no test frame is below it (a thread starts in the standard library),
    so the outermost user frame is ``fn``'s, as a script's ``main`` is under ``mnify run``."""
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    thread.join()


def _module(path: Path, text: str) -> ModuleType:
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """``train.main(hook, path)`` calls ``nets.save(hook, path)``, which "opens" ``path``
    for writing by calling the hook from its own frame, as CPython calls an audit hook."""
    monkeypatch.chdir(tmp_path)
    nets = _module(
        tmp_path / "nets.py",
        "def save(hook, path, mode='w'):\n    hook('open', (path, mode, 0))\n",  # line 2
    )
    monkeypatch.setitem(sys.modules, "nets", nets)
    train = _module(
        tmp_path / "train.py",
        "import nets\n"
        "def main(hook, path, mode='w'):\n"
        "    nets.save(hook, path, mode)\n"  # line 3
        "def entry(hook, path):\n"
        "    main(hook, path)\n",
    )
    return train, nets


def test_a_write_is_recorded_once_with_the_entry_line_and_the_writing_line(
    project: tuple[Any, Any], tmp_path: Path
) -> None:
    train, _ = project
    record = WriteRecord(filter=WriteFilter())
    hook = audit_hook(record)
    _in_a_thread(train.entry, hook, "result/model.json")
    _in_a_thread(train.nets.save, hook, "result/model.json")  # a second write: the first is kept
    assert record.files == {str(tmp_path / "result/model.json"): "train.py:3 -> nets.py:2"}


def test_reads_other_events_and_exempt_files_are_not_recorded(
    project: tuple[Any, Any], tmp_path: Path
) -> None:
    train, _ = project
    record = WriteRecord(filter=WriteFilter(home_hidden=str(tmp_path / "home" / ".")))
    hook = audit_hook(record)
    train.main(hook, "data.npz", "r")
    train.main(hook, "data.npz", "rb")
    hook("import", ("numpy", None, [], [], []))
    hook("os.listdir", (str(tmp_path),))
    train.main(hook, os.devnull)
    train.main(hook, str(tmp_path / "__pycache__" / "x.cpython-311.pyc"))
    train.main(hook, str(tmp_path / "home" / ".cache" / "matplotlib" / "fontlist.json"))
    scratch = str(tmp_path / "result" / "tmpabc")
    hook("tempfile.mkdtemp", (scratch,))
    train.main(hook, os.path.join(scratch, "snapshot_iter_4"))
    assert record.files == {}
    hook("os.rename", (os.path.join(scratch, "snapshot_iter_4"), "result/snapshot_iter_4", -1, -1))
    assert list(record.files) == [str(tmp_path / "result" / "snapshot_iter_4")]


def test_the_hook_never_raises_into_the_code_that_raised_the_event() -> None:
    hook = audit_hook(WriteRecord(filter=WriteFilter()))
    hook("open", ())  # sys.audit("open") by hand
    hook("open", ("x", ["w"], 0))  # a mode nobody hashes
    hook("os.rename", (object(),))


def test_os_open_flags_count_as_a_write(project: tuple[Any, Any], tmp_path: Path) -> None:
    record = WriteRecord(filter=WriteFilter())
    hook = audit_hook(record)
    hook("open", ("read.bin", None, os.O_RDONLY))
    hook("open", ("made.bin", None, os.O_WRONLY | os.O_CREAT))
    hook("open", (7, "w", 0))  # a file descriptor: its opening was seen
    assert list(record.files) == [str(tmp_path / "made.bin")]


def test_files_tempfile_makes_are_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their names come to the hook before tempfile's own event does: the stack tells."""
    record = WriteRecord(filter=WriteFilter())
    hook = audit_hook(record)
    real_open = os.open

    def watched(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        hook("open", (path, None, flags))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", watched)
    with tempfile.NamedTemporaryFile(dir=tmp_path):
        pass
    monkeypatch.undo()
    assert record.files == {}


def test_a_rank_stops_recording_at_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(write_net, "MAX_FILES", 3)
    record = WriteRecord(filter=WriteFilter())
    hook = audit_hook(record)
    for i in range(5):
        hook("open", (str(tmp_path / f"img_{i}.png"), "wb", 0))
    assert len(record.files) == 3 and record.truncated


# -- rank 0's line to mnify run -----------------------------------------------------------------


def test_rank_0_s_json_line_is_taken_out_and_read_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = NetReport([SharedWrite("result/a.json", [1], "train.py:5", "same-file")])
    monkeypatch.setenv("MNIFY_LAUNCH", json.dumps({"write_net_report": True}))
    write_net.say(report)
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(WRITE_NET_PREFIX)
    collector = TracebackCollector()
    assert collector.feed(0, line) == []  # not shown raw
    assert write_net_outcome(collector.write_net_reports) == report
    assert write_net_outcome([]) is None

    monkeypatch.delenv("MNIFY_LAUNCH")  # a plain mpiexec: rank 0 says the lines itself
    write_net.say(report)
    assert capsys.readouterr().err.splitlines() == render(report)
