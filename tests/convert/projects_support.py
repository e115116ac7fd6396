"""The realistic multi-file projects of ``fixtures/corpus/projects``: finding, converting, running.

Each project directory holds ``mnify-case.json``::

    {"entry": "train.py", "args": [...], "writes": ["result/log", ...],
     "tail_marker": "<start of a line the post-training tail prints>", "patterns": [1, 2, ...],
     "setup": "preprocess.py",        # optional: run once before training (makes data files)
     "distributed": true,             # optional: already ChainerMN, conversion changes nothing
     "final_models": ["result/model.npz"]}  # optional: npz files that hold the trained model

``{root}`` in ``args`` stands for the directory the project is installed in (for data files and
configs given by path), since every rank runs in its own working directory.

The converted project runs under :data:`LAUNCHER`, which chdirs each rank into ``rank<N>/`` (so
"only rank 0 writes" is checked on the file system) and, once the script returns, prints one
``MNIFY-PROBE {json}`` line: a digest of every optimizer target's parameters and of every
training iterator's dataset. Equal parameters on all ranks mean gradients were averaged; different
datasets mean each rank trained on its own shard. Together: the run was data parallel. The model
files a project saves at the end must hold those trained parameters (not an untrained copy).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy

from mnify.converter import ConvertOptions, convert_sources
from tests.support import examples_seen
from tests.support.mpirun import RankRun, mpi_env, run_ranks

PROJECTS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus" / "projects"
CASE_FILE = "mnify-case.json"
PROBE = "MNIFY-PROBE "
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", CASE_FILE)


@dataclass(frozen=True)
class Project:
    """One corpus project and how to run it tiny."""

    name: str
    root: Path
    entry: str
    args: tuple[str, ...]
    writes: tuple[str, ...]
    tail_marker: str
    patterns: tuple[int, ...]
    setup: str | None = None
    distributed: bool = False
    final_models: tuple[str, ...] = ()
    # issue 12, pattern 7: left as it is, with this said in the report (needs a person)
    needs_person: str | None = None
    # why which examples each rank trained on cannot be compared (random augmentation, ...)
    examples_unchecked: str = ""

    def sources(self) -> dict[str, str]:
        """``{path: text}`` of every .py file, keyed by real path as ``mnify convert DIR`` does."""
        files: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
        return {str(f): f.read_text(encoding="utf-8") for f in files}

    def argv(self, installed: Path) -> list[str]:
        return [a.replace("{root}", str(installed)) for a in self.args]


def load_projects() -> list[Project]:
    projects = []
    for case_file in sorted(PROJECTS.glob(f"*/{CASE_FILE}")):
        spec: dict[str, Any] = json.loads(case_file.read_text(encoding="utf-8"))
        projects.append(
            Project(
                name=case_file.parent.name,
                root=case_file.parent,
                entry=spec["entry"],
                args=tuple(spec["args"]),
                writes=tuple(spec["writes"]),
                tail_marker=spec["tail_marker"],
                patterns=tuple(spec["patterns"]),
                setup=spec.get("setup"),
                distributed=bool(spec.get("distributed", False)),
                final_models=tuple(spec.get("final_models", ())),
                needs_person=spec.get("needs_person"),
                examples_unchecked=str(spec.get("examples_unchecked", "")),
            )
        )
    return projects


def convert(sources: dict[str, str], options: ConvertOptions | None = None) -> dict[str, str]:
    """Convert a project's files together; raise AssertionError naming any file that failed."""
    results = convert_sources(sources, options or ConvertOptions())
    errors = {r.path: r.error for r in results if r.error is not None}
    assert not errors, f"conversion failed: {errors}"
    out = {}
    for r in results:
        # a skipped file (``# mnify: noqa``) is installed as written
        out[r.path] = r.output if r.output is not None else r.source
    return out


def convert_elsewhere(project: Project, hash_seed: int) -> dict[str, str]:
    """:func:`convert` in a fresh interpreter with another string-hash seed (determinism)."""
    code = (
        "import json, sys\n"
        "from tests.convert.projects_support import convert, load_projects\n"
        "project = next(p for p in load_projects() if p.name == sys.argv[1])\n"
        "print(json.dumps(convert(project.sources())))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, project.name],
        env=mpi_env({"PYTHONHASHSEED": str(hash_seed)}),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out: dict[str, str] = json.loads(run.stdout)
    return out


def install(project: Project, outputs: dict[str, str], where: Path) -> Path:
    """Copy the project (configs, data) to ``where`` with its .py files replaced by ``outputs``."""
    shutil.copytree(project.root, where, ignore=_IGNORE)
    for path, text in outputs.items():
        (where / Path(path).relative_to(project.root)).write_text(text, encoding="utf-8")
    if project.setup is not None:
        # the original preprocessing script makes the data, once, in the install directory
        subprocess.run(
            [sys.executable, str(project.root / project.setup)],
            cwd=where,
            env=mpi_env(),
            check=True,
            capture_output=True,
            timeout=120,
        )
    return where


# Where the launcher runs what: filled in per run, in front of LAUNCHER.
_LAUNCH_SETTINGS = """\
BASE = {base!r}
SCRIPTDIR = {scriptdir!r}
SCRIPT = {script!r}
ARGV = {args!r}
PROBE_PREFIX = {probe!r}
"""

# Runs the entry in ./rank<N>/ and prints the probe; guarded so a forkserver that imports this
# launcher as __mp_main__ does nothing. Evaluators that override evaluate() (their metric need not
# be a mean) are evaluated once more after the run, as the converted script wires them, and rank 0
# evaluates an unwrapped copy over every rank's shard together: the two must agree.
LAUNCHER = r"""
import copy, hashlib, json, os, random, runpy, sys

import numpy


def _feed(h, x):
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        a = numpy.ascontiguousarray(numpy.asarray(x))
        h.update(repr((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    elif isinstance(x, (tuple, list)):
        h.update(b"(")
        for y in x:
            _feed(h, y)
        h.update(b")")
    elif isinstance(x, dict):
        for k in sorted(x):
            h.update(repr(k).encode())
            _feed(h, x[k])
    else:
        h.update(repr(x).encode())


def _dataset_digest(ds):
    # random transforms read the same numbers on every rank; the script's streams are restored
    np_state, py_state = numpy.random.get_state(), random.getstate()
    numpy.random.seed(0)
    random.seed(0)
    try:
        h = hashlib.sha1()
        for i in range(len(ds)):
            _feed(h, ds[i])
        return [len(ds), h.hexdigest()]
    finally:
        numpy.random.set_state(np_state)
        random.setstate(py_state)


def _array_digest(array):
    h = hashlib.sha1()
    _feed(h, array)
    return h.hexdigest()


def _named_params(link):
    return {
        name: _array_digest(None if p.array is None else chainer.backends.cuda.to_cpu(p.array))
        for name, p in link.namedparams()
    }


def _floats(observation):
    out = {}
    for key, value in observation.items():
        value = getattr(value, "array", value)
        out[key] = float(chainer.backends.cuda.to_cpu(numpy.asarray(value)))
    return out


def _evaluate(ext, evaluate):
    # what Evaluator.__call__ sets up around evaluate(): a reporter observing the targets
    reporter = chainer.Reporter()
    prefix = ext.name + "/" if ext.name is not None else ""
    for name, target in ext._targets.items():
        reporter.add_observer(prefix + name, target)
        reporter.add_observers(prefix + name, target.namedlinks(skipself=True))
    with reporter, chainer.using_config("train", False):
        return _floats(evaluate())


def _overriding_evaluators(trainers):
    base = chainer.training.extensions.Evaluator
    found = []
    for trainer in trainers:
        for name, entry in trainer._extensions.items():
            ext = entry.extension
            if isinstance(ext, base) and type(ext).evaluate is not base.evaluate:
                found.append((name, ext))
    return found


def _check_evaluators(trainers):
    # [{name, dist, ref}] on rank 0: what the script's evaluator reports now, and what the
    # evaluator's own evaluate() gives over every rank's shard together
    mpi = None
    if "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].Is_initialized():
        mpi = sys.modules["mpi4py.MPI"].COMM_WORLD
    evaluators = _overriding_evaluators(trainers)
    names = [name for name, _ in evaluators]
    common = names
    if mpi is not None:
        everyone = mpi.allgather(names)
        common = [n for n in names if all(n in other for other in everyone)]
    results = []
    for name, ext in evaluators:
        if name not in common:
            continue  # one rank alone evaluates: nothing was split
        it = ext._iterators["main"]
        dataset = getattr(it, "dataset", None)
        dist = _evaluate(ext, ext.evaluate)
        shard = [dataset[i] for i in range(len(dataset))] if dataset is not None else None
        shards = mpi.gather(shard, root=0) if mpi is not None else [shard]
        if mpi is not None and mpi.rank != 0:
            continue
        if any(s is None for s in shards):
            results.append({"name": name, "dist": dist, "ref": None})
            continue
        whole = [example for s in shards for example in s]
        ref = copy.copy(ext)
        vars(ref).pop("evaluate", None)
        ref._iterators = dict(ext._iterators)
        ref._iterators["main"] = chainer.iterators.SerialIterator(
            whole, getattr(it, "batch_size", 32), repeat=False, shuffle=False)
        ref_value = _evaluate(ref, lambda: type(ext).evaluate(ref))
        results.append({"name": name, "dist": dist, "ref": ref_value})
    return results


if __name__ == "__main__":
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    workdir = os.path.join(BASE, "rank" + rank)
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)
    sys.path.insert(0, SCRIPTDIR)
    sys.argv = [SCRIPT] + ARGV
    if os.environ.get("MNIFY_EXAMPLES_OUT"):
        # records which examples this process trains on (tests/support/examples_seen.py)
        from tests.support.examples_seen import install

        install(os.environ["MNIFY_EXAMPLES_OUT"])

    import chainer
    import chainer.training

    targets, datasets, trainers = [], [], []

    def _remember(ds):
        if ds is not None and all(d is not ds for d in datasets):
            datasets.append(ds)

    _setup = chainer.Optimizer.setup

    def setup(self, link):
        if all(t is not link for t in targets):
            targets.append(link)
        return _setup(self, link)

    chainer.Optimizer.setup = setup
    _run = chainer.training.Trainer.run

    def run(self, *args, **kwargs):
        trainers.append(self)
        for it in getattr(self.updater, "_iterators", {}).values():
            _remember(getattr(it, "dataset", None))
        return _run(self, *args, **kwargs)

    chainer.training.Trainer.run = run
    # a repeating iterator's dataset counts once the iterator yields a batch (one built and
    # then replaced before training, as mn.distribute_trainers does, trained on nothing)
    for cls in (chainer.iterators.SerialIterator, chainer.iterators.MultiprocessIterator):
        def next_batch(self, _next=cls.__next__):
            if getattr(self, "repeat", getattr(self, "_repeat", False)):
                _remember(self.dataset)
            return _next(self)
        cls.__next__ = next_batch
        cls.next = next_batch

    try:
        runpy.run_path(SCRIPT, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    probe = {
        "params": [_named_params(t) for t in targets],
        "datasets": [_dataset_digest(d) for d in datasets],
        "evaluators": _check_evaluators(trainers),
    }
    print(PROBE_PREFIX + json.dumps(probe), flush=True)
"""


def _launcher(project: Project, installed: Path, base: Path) -> str:
    script = installed / project.entry
    settings = _LAUNCH_SETTINGS.format(
        base=str(base),
        scriptdir=str(script.parent),
        script=str(script),
        args=project.argv(installed),
        probe=PROBE,
    )
    return settings + LAUNCHER


def run_single(project: Project, installed: Path, base: Path) -> subprocess.CompletedProcess[str]:
    """Run the installed entry as one plain process (no mpiexec) in ``base/rank0``; the
    examples it trains on go to ``base/examples.json``."""
    launcher = base / "launcher.py"
    launcher.write_text(_launcher(project, installed, base), encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(launcher)],
        cwd=base,
        env=mpi_env({examples_seen.OUT_ENV: str(base / "examples.json")}),
        capture_output=True,
        text=True,
        timeout=150,
    )


def run_on_ranks(
    project: Project, installed: Path, base: Path, n: int = 2, env: dict[str, str] | None = None
) -> RankRun:
    """Run the installed entry on ``n`` ranks, each in ``base/rank<N>``; failures are returned.
    ``env`` adds to the run's environment (verification, say)."""
    source = _launcher(project, installed, base)
    return run_ranks(
        n,
        source,
        timeout=150,
        cwd=base,
        check=False,
        # a collective that some rank never reaches fails the run instead of hanging it
        env={
            "MNIFY_WATCHDOG_TIMEOUT": "40",
            examples_seen.OUT_ENV: str(base / "examples.rank{rank}.json"),
            **(env or {}),
        },
    )


def single_examples(project: Project) -> Counter[str]:
    """The examples the original project trains on as one process (run once per session)."""
    return _single_examples(project.name)


@functools.cache
def _single_examples(name: str) -> Counter[str]:
    project = next(p for p in load_projects() if p.name == name)
    base = Path(tempfile.mkdtemp(prefix=f"mnify-project-{name}-"))
    installed = install(project, project.sources(), base / "code")
    run = run_single(project, installed, base)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return examples_seen.read(base / "examples.json")


def rank_examples(base: Path, n: int) -> list[Counter[str]]:
    return [examples_seen.read(base / f"examples.rank{r}.json") for r in range(n)]


def probe_of(lines: list[str]) -> dict[str, Any]:
    """The probe among one process's output lines; AssertionError if it printed none."""
    found = [line for line in lines if line.startswith(PROBE)]
    assert found, "no probe printed (did the script finish?)"
    probe: dict[str, Any] = json.loads(found[-1][len(PROBE) :])
    return probe


def probes(run: RankRun, n: int) -> list[dict[str, Any]]:
    """Each rank's probe; AssertionError naming the rank (with all output) if one printed none."""
    found = []
    for rank in range(n):
        try:
            found.append(probe_of(run.rank_lines(rank)))
        except AssertionError:
            raise AssertionError(f"rank {rank} printed no probe\n{run.describe()}") from None
    return found


def stale_model_files(folder: Path, files: tuple[str, ...], params: list[dict[str, str]]) -> list:
    """Arrays of the model files that do not hold the trained parameters, as (file, key).

    ``params`` are the probe's ``{name: digest}`` of every optimizer target after training. A
    key of a saved file names a parameter when some target parameter's name ends with it
    (``enc1/conv/W`` is ``/predictor/enc1/conv/W``); its array must then equal that
    parameter. A file with no parameter at all is reported as ``(file, None)``.
    """
    stale: list = []
    for pattern in files:
        for path in sorted(folder.glob(pattern)):
            with numpy.load(path) as saved:
                matched = False
                for key in saved.files:
                    candidates = [
                        digest
                        for target in params
                        for name, digest in target.items()
                        if name.endswith("/" + key.lstrip("/"))
                    ]
                    if not candidates:
                        continue  # a persistent (running mean) or optimizer state
                    matched = True
                    if array_digest(saved[key]) not in candidates:
                        stale.append((str(path.relative_to(folder)), key))
                if not matched:
                    stale.append((str(path.relative_to(folder)), None))
    return stale


def evaluator_mismatches(probe: dict[str, Any]) -> list[dict[str, Any]]:
    """Evaluators whose reported metrics differ from their own evaluate() over the whole set."""
    bad = []
    for e in probe["evaluators"]:
        if e["ref"] is None:
            bad.append(e)  # its iterator has no dataset to gather
            continue
        keys = sorted(set(e["dist"]) | set(e["ref"]))
        if not all(
            k in e["dist"]
            and k in e["ref"]
            and numpy.isclose(e["dist"][k], e["ref"][k], rtol=1e-5, atol=1e-7, equal_nan=True)
            for k in keys
        ):
            bad.append(e)
    return bad


def array_digest(array: numpy.ndarray) -> str:
    """The launcher's digest of an array (shape, dtype and bytes)."""
    a = numpy.ascontiguousarray(array)
    h = hashlib.sha1()
    h.update(repr((a.shape, a.dtype.str)).encode())
    h.update(a.tobytes())
    return h.hexdigest()


def marker_count(lines: list[str], marker: str) -> int:
    return sum(1 for line in lines if line.startswith(marker))


def files_under(folder: Path) -> list[str]:
    if not folder.exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
