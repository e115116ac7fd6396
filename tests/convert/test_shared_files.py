"""Item 8 of the effects issue: a file rank 0 writes and every rank reads afterwards is read only
after rank 0 wrote it (docs/converter.md, MN820 ``shared-files``).

``fixtures/shared_files/reload_best.py`` writes a token table, trains with a best-model snapshot,
saves the last weights after ``trainer.run()`` and reads both back to score the held-out set.
Converted, the writes are rank 0's; the ranks share one working directory (one file system, as
on a cluster), and the launcher makes rank 0's save of ``last.npz`` take a second: a rank that
does not wait for it reads no file (or an old one). Every rank must load the bytes rank 0 wrote.
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from mnify.converter import convert_sources
from mnify.rewrites.options import ConvertOptions
from tests.support.mpirun import REPO, mpi_env, run_ranks

SOURCE = REPO / "fixtures" / "shared_files" / "reload_best.py"

# Runs the converted script with rank 0's last save slowed down and every load recorded.
LAUNCHER = """\
import hashlib, os, runpy, sys, time
import chainer

SCRIPT, ARGV = {script!r}, {argv!r}
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
_save, _load = chainer.serializers.save_npz, chainer.serializers.load_npz


def save_npz(file, obj, *args, **kwargs):
    if str(file).endswith("last.npz"):
        time.sleep(1.0)  # a slow file system: the write lands a second late
    return _save(file, obj, *args, **kwargs)


def load_npz(file, obj, *args, **kwargs):
    with open(file, "rb") as f:
        print("LOADED", rank, os.path.basename(str(file)), hashlib.sha1(f.read()).hexdigest(),
              flush=True)
    return _load(file, obj, *args, **kwargs)


chainer.serializers.save_npz, chainer.serializers.load_npz = save_npz, load_npz
sys.argv = [SCRIPT] + ARGV
runpy.run_path(SCRIPT, run_name="__main__")
"""


def _converted() -> str:
    text = SOURCE.read_text(encoding="utf-8")
    (result,) = convert_sources({str(SOURCE): text}, ConvertOptions())
    assert result.error is None and result.output is not None, result.error
    return result.output


def _main_body(text: str) -> list[str]:
    tree = ast.parse(text)
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    return [ast.unparse(s) for s in main.body]


def test_every_rank_waits_before_reading_what_rank_0_wrote() -> None:
    output = _converted()
    body = _main_body(output)
    barriers = [i for i, s in enumerate(body) if s == "comm.barrier()"]
    assert len(barriers) == 1, body
    after = body[barriers[0] + 1]
    assert after.startswith("with open(table_path) as f:"), after
    before = body[: barriers[0]]
    assert any("save_npz(os.path.join(args.out, 'last.npz'), model)" in s for s in before)
    assert any(s.startswith("if comm.rank == 0:") and "last.npz" in s for s in before), before
    # converting the output again adds no second barrier
    (again,) = convert_sources({str(SOURCE): output}, ConvertOptions())
    assert again.output == output


def test_a_read_of_a_file_nobody_guarded_gets_no_barrier(tmp_path: Path) -> None:
    """Reading an input file the script never writes needs no wait."""
    text = SOURCE.read_text(encoding="utf-8").replace(
        "    with open(table_path) as f:\n", "    with open('settings.json') as f:\n"
    )
    text = text.replace(
        "    chainer.serializers.load_npz(os.path.join(args.out, 'last.npz'), scorer)\n", ""
    )
    (result,) = convert_sources({"reload.py": text}, ConvertOptions())
    assert result.output is not None
    assert "comm.barrier()" not in _main_body(result.output)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_rank_loads_the_weights_rank_0_saved(ranks: int, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    script = code / "reload_best.py"
    script.write_text(_converted(), encoding="utf-8")
    shared = tmp_path / "shared"  # every rank's working directory: one file system
    shared.mkdir()
    argv = ["--epoch", "2", "--n", "96", "--batchsize", "8", "--out", "result"]
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER.format(script=str(script), argv=argv), encoding="utf-8")
    run = run_ranks(ranks, launcher, timeout=240, cwd=shared)
    saved = hashlib.sha1((shared / "result" / "last.npz").read_bytes()).hexdigest()
    for rank in range(ranks):
        loads = [line.split() for line in run.rank_lines(rank) if line.startswith("LOADED")]
        assert [(w[2], w[3]) for w in loads] == [("last.npz", saved)], (rank, run.describe())


def test_the_original_runs_in_one_process(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SOURCE), "--epoch", "1", "--n", "64", "--out", "result"],
        cwd=tmp_path,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "held-out accuracy" in run.stdout
