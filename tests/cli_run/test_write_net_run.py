"""The write net on 2 real ranks under ``mnify run`` (tests/cli_run/scripts/write_net/): a
Trainer script whose post-training writes are not guarded gets one line per write from rank 0,
with the rank and the user's lines, and the same in ``--summary-json``; guarded, nothing; with
``MNIFY_WRITE_NET=0``, nothing either. The files each rank must be forgiven (named for its rank,
a temporary file in the output directory, ``/dev/null``, rank 0's Trainer log and snapshots)
are in every run."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run.console import MNIFY, rank_env
from tests.support.mpirun import run_ranks

pytestmark = pytest.mark.mpi
SCRIPTS = Path(__file__).resolve().parent / "scripts" / "write_net"


def _run(project: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``mnify run -n 2 train.py ARGS`` in a copy of the project, as its user runs it there."""
    for name in ("train.py", "nets.py"):
        shutil.copy(SCRIPTS / name, project / name)
    summary = project / "summary.json"
    proc = subprocess.run(
        [str(MNIFY), "run", "-n", "2", "--summary-json", str(summary), "train.py", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=rank_env(**env),
        stdin=subprocess.DEVNULL,
        cwd=project,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc, json.loads(summary.read_text())


def _line_of(name: str, text: str) -> int:
    lines = (SCRIPTS / name).read_text().splitlines()
    [number] = [i for i, line in enumerate(lines, 1) if text in line]
    return number


def _net_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if "mnify: rank" in line]


def test_unguarded_writes_after_training_are_named_once_with_rank_and_lines(
    tmp_path: Path,
) -> None:
    proc, summary = _run(tmp_path)
    save = _line_of("train.py", "save_structure(")
    dump = _line_of("nets.py", "json.dump(structure")
    record = _line_of("train.py", 'f"run-{os.getpid()}.txt"')
    [run_1] = [p.name for p in (tmp_path / "result").glob("run-*.txt") if p.name in proc.stderr]
    assert _net_lines(proc) == [
        f"mnify: rank 1 also wrote result/model_structure.json (train.py:{save} -> "
        f"nets.py:{dump}): guard it with if comm.rank == 0",
        f"mnify: rank 1 wrote result/{run_1} beside rank 0's files in result (train.py:{record}): "
        "guard it with if comm.rank == 0, or put the rank in its name",
    ], proc.stderr
    assert summary["category"] == "ok"
    assert summary["shared_writes"] == [
        {
            "path": "result/model_structure.json",
            "ranks": [1],
            "where": f"train.py:{save} -> nets.py:{dump}",
            "kind": "same-file",
        },
        {
            "path": f"result/{run_1}",
            "ranks": [1],
            "where": f"train.py:{record}",
            "kind": "rank-0-directory",
        },
    ]
    assert "[mnify] shared writes" not in proc.stdout + proc.stderr  # the launcher took it
    written = sorted(p.name for p in (tmp_path / "result").iterdir())
    assert {"log", "snapshot_iter_8", "times_rank1.json", "loss_1.txt"} <= set(written)


def test_guarded_writes_are_not_named(tmp_path: Path) -> None:
    proc, summary = _run(tmp_path, "--guard")
    assert _net_lines(proc) == [], proc.stderr
    assert summary["shared_writes"] == []
    assert len(list((tmp_path / "result").glob("run-*.txt"))) == 1


def test_the_switch_turns_the_net_off(tmp_path: Path) -> None:
    proc, summary = _run(tmp_path, MNIFY_WRITE_NET="0")
    assert _net_lines(proc) == [], proc.stderr
    assert summary["shared_writes"] is None  # no report came: not "nothing found"
    assert len(list((tmp_path / "result").glob("run-*.txt"))) == 2  # the script wrote as before


LINGERING = """
import time
from mnify import runtime as mn

comm = mn.create_communicator("naive")
with open("shared.txt", "w") as f:
    f.write("every rank")
if comm.rank == 0:
    time.sleep(4)  # a tail on rank 0 longer than the others wait for it at exit
"""


def test_ranks_that_stopped_waiting_at_exit_are_named_not_waited_for(tmp_path: Path) -> None:
    """Under a plain mpiexec (rank 0 says the lines itself): rank 1 gives up its exit barrier
    after 1 s and leaves a note; rank 0, whose barrier then completes, reads the note instead
    of waiting EXCHANGE_SECONDS for a record that never comes."""
    run = run_ranks(2, LINGERING, cwd=tmp_path, env={"MNIFY_EXIT_BARRIER": "1"}, timeout=120)
    said = [line for line in run.rank_lines(0) if line.startswith("mnify: ")]
    assert said == [
        "mnify: the write net did not see the files of rank 1: it left before rank 0 ended "
        "(more than MNIFY_EXIT_BARRIER seconds earlier)"
    ], run.describe()
    assert not [line for line in run.rank_lines(1) if line.startswith("mnify: ")]
