"""Converted fixtures run end to end on 2 MPI ranks on CPU, and only rank 0 writes.

Each rank runs in its own working directory (a small launcher chdirs by rank before running
the script), so "logs and snapshots are written once, by rank 0" is checked on the file
system, not guessed from output. The originals also run, single-process, with the same tiny
arguments: the fixtures are real scripts, not shapes for the converter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnify.converter import ConvertOptions, convert_sources
from tests.convert.cases import CASES, Case, expected_path, read_sources
from tests.support.mpirun import mpi_env, run_ranks

pytestmark = pytest.mark.mpi

# Runs the script in ./rank<N>/ with the given argv; guarded so a forkserver importing this
# launcher as __mp_main__ does nothing.
LAUNCHER = """\
import os, runpy, sys
if __name__ == "__main__":
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    workdir = os.path.join({base!r}, "rank" + rank)
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)
    sys.path.insert(0, {scriptdir!r})
    sys.argv = [{script!r}] + {args!r}
    runpy.run_path({script!r}, run_name="__main__")
"""


def _install(case: Case, outputs: dict[str, str], where: Path) -> Path:
    """Write the converted file(s) into ``where``; return the script to run."""
    where.mkdir(parents=True, exist_ok=True)
    for rel, text in outputs.items():
        name = Path(rel).name if case.multi else "train.py"
        (where / name).write_text(text, encoding="utf-8")
    return where / ("train.py" if not case.multi else case.entry)


def _converted(case: Case, options: ConvertOptions | None = None) -> dict[str, str]:
    results = convert_sources(read_sources(case), options or case.options)
    out = {}
    for r in results:
        assert r.output is not None, r.error
        out[r.path] = r.output
    return out


def _run_on_ranks(n: int, script: Path, args: list[str], base: Path, timeout: int = 240):
    source = LAUNCHER.format(
        base=str(base), scriptdir=str(script.parent), script=str(script), args=args
    )
    return run_ranks(n, source, timeout=timeout, cwd=base)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_converted_fixture_runs_on_two_ranks(case: Case, tmp_path: Path) -> None:
    outputs = {
        rel: expected_path(case, rel).read_text(encoding="utf-8") for rel in read_sources(case)
    }
    script = _install(case, outputs, tmp_path / "code")
    run = _run_on_ranks(2, script, list(case.run_args), tmp_path)
    assert run.returncode == 0, run.output
    for pattern in case.writes:
        found = list((tmp_path / "rank0").glob(pattern))
        assert found, f"rank 0 did not write {pattern}:\n{run.output}"
    rank1 = tmp_path / "rank1"
    written = sorted(str(p.relative_to(rank1)) for p in rank1.rglob("*") if p.is_file())
    assert written == [], f"rank 1 wrote {written}: logs and snapshots must be written once"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_original_fixture_runs_single_process(case: Case, tmp_path: Path) -> None:
    script = case.source / case.entry if case.multi else case.source
    run = subprocess.run(
        [sys.executable, str(script), *case.run_args],
        cwd=tmp_path,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _log(path: Path) -> list[dict[str, float]]:
    return json.loads(path.read_text())


def _params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files if "/predictor/" in k}


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.smoke
def test_mnist_strong_scaling_reproduces_single_process(ranks: int, tmp_path: Path) -> None:
    """Global batch kept (--scaling strong): same validation loss curve and same weights.

    Every step uses the whole training set (batch = dataset size), so the sample order each
    rank sees does not matter and N ranks with batch B/N compute exactly the gradient of one
    process with batch B.
    """
    case = next(c for c in CASES if c.name == "mnist_mlp")
    n = 24
    args = [
        "--synthetic",
        str(n),
        "--batchsize",
        str(n),
        "--epoch",
        "4",
        "--unit",
        "16",
        "--noplot",
        "--out",
        "result",
    ]
    single = tmp_path / "single"
    single.mkdir()
    subprocess.run(
        [sys.executable, str(case.source), *args],
        cwd=single,
        env=mpi_env(),
        check=True,
        capture_output=True,
        timeout=240,
    )
    outputs = _converted(case, ConvertOptions(scaling="strong"))
    script = _install(case, outputs, tmp_path / "code")
    run = _run_on_ranks(ranks, script, args, tmp_path)
    assert run.returncode == 0, run.output
    one = _log(single / "result" / "log")
    many = _log(tmp_path / "rank0" / "result" / "log")
    assert [e["epoch"] for e in one] == [e["epoch"] for e in many]
    np.testing.assert_allclose(
        [e["validation/main/loss"] for e in many],
        [e["validation/main/loss"] for e in one],
        rtol=1e-5,
    )
    final = "snapshot_iter_4"
    p_one, p_many = (
        _params(single / "result" / final),
        _params(tmp_path / "rank0" / "result" / final),
    )
    assert p_one.keys() == p_many.keys() and p_one
    for key in p_one:
        np.testing.assert_allclose(p_many[key], p_one[key], rtol=1e-5, atol=1e-7, err_msg=key)
