"""Issue 21, "Must show": training inside a library-style helper converts and is data-parallel.

``fixtures/parity/library_helper`` is a script that builds a model and hands it to ``mylib``, a
small in-house package that loads data through an on-disk preprocessing cache
(``mylib.data.load_points``) and trains with its own optimizer, iterators, Trainer and
extensions (``mylib.training.run_train``). ``mnify convert DIR --outtree OUT`` (the CLI, as a
user runs it) adds ``mn.distribute_trainers(comm)`` after the communicator and puts the cache
under rank 0 with a barrier. The converted project then runs on N ranks at per-rank batch b,
each rank in its own working directory, and the original once in one process at batch N·b:

* the saved parameters agree to float64 rounding (the training set is one global batch, so each
  update of either run sees every example; see tests/convert/test_pattern_parity.py), and a run
  at batch b ends elsewhere (the comparison can fail);
* each rank's model saw a disjoint share of the examples, together all of them (a launcher
  records a fingerprint of every training example ``Classifier.forward`` receives);
* every rank ends with the same parameters, rank 1 writes no file, and the cache is built once.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from tests.convert.test_pattern_parity import (
    ATOL,
    DTYPE_ENV,
    PARITY,
    RTOL,
    TIMEOUT,
    differences,
    mnify_convert,
    saved_arrays,
)
from tests.support.mpirun import mpi_env, run_ranks

TREE = PARITY / "library_helper"
BATCH = 4  # per rank
EPOCHS = 3
SAVED = "mlp_final.npz"

# Runs the entry in BASE/<tag><rank>/ and records, per process, the fingerprints of the training
# examples the classifier saw and its final parameters.
LAUNCHER = """\
import atexit, hashlib, json, os, runpy, sys
import chainer, chainer.links as L, numpy

BASE, TAG, SCRIPT, ARGV = {base!r}, {tag!r}, {script!r}, {argv!r}
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
workdir = os.path.join(BASE, TAG + rank)
os.makedirs(workdir, exist_ok=True)
os.chdir(workdir)
sys.path.insert(0, os.path.dirname(SCRIPT))
sys.argv = [SCRIPT] + ARGV
seen, models = [], []
_forward = L.Classifier.forward


def forward(self, *args, **kwargs):
    if chainer.config.train:
        if all(m is not self for m in models):
            models.append(self)
        rows = numpy.ascontiguousarray(chainer.backend.CpuDevice().send(args[0]))
        seen.extend(hashlib.sha1(row.tobytes()).hexdigest() for row in rows)
    return _forward(self, *args, **kwargs)


L.Classifier.forward = forward


def record():
    record = {{"seen": seen, "params": {{}}}}
    for model in models:
        for name, p in sorted(model.namedparams()):
            record["params"][name] = numpy.asarray(p.array).tolist()
    with open(os.path.join(BASE, "probe." + TAG + rank + ".json"), "w") as f:
        json.dump(record, f)


atexit.register(record)
runpy.run_path(SCRIPT, run_name="__main__")
"""


def _launcher(base: Path, tag: str, script: Path, argv: list[str]) -> Path:
    path = base / f"launch_{tag}.py"
    path.write_text(
        LAUNCHER.format(base=str(base), tag=tag, script=str(script), argv=argv), encoding="utf-8"
    )
    return path


def _argv(n_train: int, batch: int, cache: Path) -> list[str]:
    return [
        "--n-train",
        str(n_train),
        "--batchsize",
        str(batch),
        "--epoch",
        str(EPOCHS),
        "--cache",
        str(cache),
        "--out",
        "result",
    ]


def _probe(base: Path, name: str) -> dict:
    return json.loads((base / f"probe.{name}.json").read_text(encoding="utf-8"))


def _run_original(base: Path, tree: Path, tag: str, n_train: int, batch: int) -> Path:
    launcher = _launcher(base, tag, tree / "train.py", _argv(n_train, batch, base / f"cache_{tag}"))
    run = subprocess.run(
        [sys.executable, str(launcher)],
        env=mpi_env(DTYPE_ENV),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, f"original at batch {batch} failed\n{run.stdout}\n{run.stderr}"
    return base / f"{tag}0" / "result" / SAVED


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _calls(tree: ast.AST) -> list[str]:
    return [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_conversion_adds_distribute_trainers_and_builds_the_cache_on_rank_0(
    tmp_path: Path,
) -> None:
    out = tmp_path / "converted"
    result = mnify_convert(str(TREE), "--outtree", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    main = next(
        n
        for n in ast.parse((out / "train.py").read_text(encoding="utf-8")).body
        if isinstance(n, ast.FunctionDef) and n.name == "main"
    )
    body = [ast.unparse(s) for s in main.body]
    creation = next(i for i, s in enumerate(body) if s.startswith("comm = mn.create_communicator"))
    assert body[creation + 1] == "mn.distribute_trainers(comm)"
    assert "Experiment(args.batchsize, args.epoch).fit(model, train, valid, args.out)" in body

    load = next(
        n
        for n in ast.parse((out / "mylib" / "data.py").read_text(encoding="utf-8")).body
        if isinstance(n, ast.FunctionDef) and n.name == "load_points"
    )
    statements = load.body
    at = next(i for i, s in enumerate(statements) if isinstance(s, ast.If))
    guard = statements[at]
    assert ast.unparse(statements[1]) == "comm = mn.current_communicator()"  # after the docstring
    assert ast.unparse(guard.test) == "comm.rank == 0" and not guard.orelse
    assert [ast.unparse(s.test) for s in guard.body] == ["not os.path.exists(path)"]
    assert ast.unparse(statements[at + 1]) == "comm.barrier()"
    # a method of the training flow that records the settings: its directory is made by
    # rank 0 while the others wait, its file written by rank 0 only, where they are
    pipeline = ast.parse((out / "mylib" / "pipeline.py").read_text(encoding="utf-8"))
    experiment = next(n for n in pipeline.body if isinstance(n, ast.ClassDef))
    record = next(
        n for n in experiment.body if isinstance(n, ast.FunctionDef) and n.name == "record_settings"
    )
    lines = [ast.unparse(s) for s in record.body]
    assert lines[0] == "comm = mn.current_communicator()", lines
    assert lines[1].startswith("if comm.rank == 0:\n    if not os.path.isdir(out):"), lines
    assert lines[2] == "comm.barrier()", lines
    assert lines[4].startswith(
        "if comm.rank == 0:\n    with open(os.path.join(out, 'settings.json')"
    )
    # what the entry point never reaches may run where no communicator exists: left as it is
    export = next(n for n in pipeline.body if isinstance(n, ast.FunctionDef))
    original = ast.parse((TREE / "mylib" / "pipeline.py").read_text(encoding="utf-8"))
    assert ast.unparse(export) == ast.unparse(
        next(n for n in original.body if isinstance(n, ast.FunctionDef))
    )
    # the training helper itself is unchanged: the runtime converts its Trainer
    training = TREE / "mylib" / "training.py"
    assert (out / "mylib" / "training.py").read_text() == training.read_text()
    assert "mn.create_multi_node_optimizer" not in _calls(ast.parse(training.read_text()))


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_library_helper_trains_on_ranks_like_one_process_at_the_combined_batch(
    ranks: int, tmp_path: Path
) -> None:
    out = tmp_path / "converted"
    result = mnify_convert(str(TREE), "--outtree", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    original = tmp_path / "original"
    shutil.copytree(TREE, original, ignore=shutil.ignore_patterns("__pycache__"))
    n_train = ranks * BATCH  # one global batch

    reference = saved_arrays(_run_original(tmp_path, original, "global", n_train, ranks * BATCH))
    small = saved_arrays(_run_original(tmp_path, original, "small", n_train, BATCH))

    cache = tmp_path / "cache_ranks"
    launcher = _launcher(tmp_path, "rank", out / "train.py", _argv(n_train, BATCH, cache))
    run = run_ranks(ranks, launcher, timeout=TIMEOUT, env=DTYPE_ENV)

    got = saved_arrays(tmp_path / "rank0" / "result" / SAVED)
    max_abs, _, bad = differences(reference, got)
    assert not bad, f"{bad} differ from one process at batch {ranks * BATCH}: {max_abs:.3g}"
    small_abs, _, bad_small = differences(small, got)
    print(f"{ranks} ranks: max |ranks - one process at N*b| {max_abs:.3g}, at b {small_abs:.3g}")
    assert bad_small, "the run at the per-rank batch ends at the same parameters: too weak"

    probes = [_probe(tmp_path, f"rank{r}") for r in range(ranks)]
    everything = _probe(tmp_path, "global0")["seen"]
    assert len(set(everything)) == n_train
    for r, probe in enumerate(probes):
        assert len(probe["seen"]) == EPOCHS * BATCH, (r, len(probe["seen"]))
        for other in range(r + 1, ranks):
            shared = set(probe["seen"]) & set(probes[other]["seen"])
            assert not shared, f"ranks {r} and {other} trained on {len(shared)} same examples"
        assert probe["params"] == probes[0]["params"], f"rank {r} ended elsewhere"
    assert set().union(*(set(p["seen"]) for p in probes)) == set(everything)

    for r in range(1, ranks):
        assert _files_under(tmp_path / f"rank{r}") == [], f"rank {r} wrote files"
    assert {
        "result/log",
        f"result/{SAVED}",
        f"result/model_epoch_{EPOCHS}",
        "result/settings.json",
    } <= set(_files_under(tmp_path / "rank0"))
    built = [
        line for r in range(ranks) for line in run.rank_lines(r) if "mylib: building cache" in line
    ]
    assert len(built) == 2 and all(line in run.rank_lines(0) for line in built), built
    assert sorted(p.name for p in cache.iterdir()) == ["points_11_1.npz", f"points_{n_train}_0.npz"]
    summary = [line for line in run.rank_lines(0) if "distribute_trainers:" in line]
    assert len(summary) == 1, run.describe()
    assert not [line for line in run.rank_lines(1) if "distribute_trainers" in line]
    numpy.testing.assert_allclose(got["predictor/l1/W"], reference["predictor/l1/W"], RTOL, ATOL)
