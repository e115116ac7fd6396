"""The converter against a corpus of realistic single-file Chainer scripts (fixtures/corpus/scripts).

The fixtures in fixtures/convert are written in the converter's own style; these are written
the way people write training scripts (custom loops with sibling ifs, Trainer scripts with many
extensions, GANs with custom updaters, helper-based scripts, module-level scripts, ChainerMN
scripts). For every script: the conversion succeeds, is a pure function of its input (twice in
this process, and under other hash seeds and allocators), is a fixed point, keeps every
signature, adds no MN301/MN302 hazard, compiles; already distributed scripts come back
unchanged; the original runs on one process and the converted script on 2 MPI ranks, where
rank 0 writes what the original writes and rank 1 writes nothing.

Known converter failures live in cases.toml as strict xfails (see corpus_support.py).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from mnify.converter import ConvertOptions, FileResult, convert_sources
from mnify.lint import lint_source
from tests.convert.corpus_support import (
    CHECKS,
    CORPUS,
    CorpusScript,
    files_under,
    launcher_source,
    params,
    read_table,
    script_names,
    writes_mismatch,
)
from tests.support import examples_seen
from tests.support.mpirun import REPO, mpi_env, run_ranks
from tests.support.verdict import findings_of, verdict_of, verify_env

OPTIONS = ConvertOptions()
# Hash seeds and allocators the output must not depend on (docs/design.md §0).
# (this process runs under a random hash seed and pymalloc: each fresh one differs from it in
# both, and from the other in the seed)
ENVIRONMENTS = {
    "hashseed0": {"PYTHONHASHSEED": "0"},
    "hashseed12345-malloc": {"PYTHONHASHSEED": "12345", "PYTHONMALLOC": "malloc"},
}
# Converts the files named on its command line one by one, prints {path: output or error}.
CONVERT_EACH = """\
import json, sys
from mnify.converter import convert_sources
out = {}
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        result = convert_sources({path: f.read()})[0]
    out[path] = result.output if result.error is None else "error: " + result.error
json.dump(out, sys.stdout)
"""
E2E_TIMEOUT = 180
# The scripts also run under ``--verify`` (docs/verify.md) on 2 ranks: one per style of data
# feeding, so the corpus's CI time grows by a few short runs, not by a second pass over all of
# it (each verified run stops after 3 updates). Hand-written loops first: their split is the
# converter's own (MN815), not scatter_dataset behind an iterator.
VERIFIED = (
    "loop_manual_permutation_v1",  # v1-era permutation loop over arrays
    "loop_generator_minibatches",  # a generator yielding slices
    "loop_trainer_class_array_split",  # a trainer class, np.array_split of indices
    "loop_tupledataset_concat",  # TupleDataset indexed by hand, concat_examples
    "loop_tutorial_constants",  # literal counts, no argparse
    "loop_competition_module_level",  # module-level competition script
    "loop_masked_sequences",  # inputs, labels and masks indexed alongside
    "loop_logging_file_handlers",  # log files on rank 0 only
    "trainer_many_extensions",  # a Trainer with the usual extensions
    "gan_dcgan_updater",  # two optimizers, a custom updater
    "trainer_helper_functions",  # optimizer and extensions made by helpers
    "trainer_topk_extension_dictconfig",  # dictConfig log file, an extension holding test data
)
# (the chainermn_* scripts import ChainerMN itself, whose create_communicator starts no
# verification: they are left out)
# script -> why its verified run has a finding the converter cannot fix (strict xfails)
VERIFY_FAILURES: dict[str, str] = {}


@functools.cache
def converted(name: str) -> FileResult:
    script = next(s for s in CORPUS if s.name == name)
    return convert_sources({str(script.path): script.source}, OPTIONS)[0]


def output_of(script: CorpusScript) -> str:
    result = converted(script.name)
    assert result.error is None, f"{script.name}: {result.error}"
    assert result.output is not None
    return result.output


@functools.cache
def converted_in_subprocesses() -> dict[str, dict[str, str]]:
    """Every corpus script converted in a fresh interpreter per environment (run side by side)."""
    procs = {}
    for name, extra in ENVIRONMENTS.items():
        env = dict(os.environ)
        env.update(extra)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", CONVERT_EACH, *(str(s.path) for s in CORPUS)],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{name}: {err}"
        results[name] = json.loads(out)
    return results


def test_table_covers_exactly_the_scripts() -> None:
    table = read_table()
    names = script_names()
    assert len(names) >= 48
    assert sorted(table) == names, "cases.toml and fixtures/corpus/scripts/*.py disagree"
    assert set(VERIFIED) <= set(names) and set(VERIFY_FAILURES) <= set(VERIFIED)
    for name, row in table.items():
        # a tutorial script without argparse runs with no arguments (args = [])
        assert "args" in row and row.get("writes"), f"{name}: no args or no writes"
        unknown = set(row.get("known_failures", {})) - set(CHECKS)
        assert not unknown, f"{name}: unknown checks {unknown}"
    assert sum(s.already_distributed for s in CORPUS) >= 4


@pytest.mark.parametrize("script", [pytest.param(s, id=s.name) for s in CORPUS])
def test_script_starts_with_one_line_docstring(script: CorpusScript) -> None:
    module = ast.parse(script.source)
    first = module.body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    assert isinstance(first.value.value, str) and first.lineno == 1
    assert "\n" not in first.value.value.strip()


@pytest.mark.parametrize("script", params("convert"))
def test_converts_without_error(script: CorpusScript) -> None:
    result = converted(script.name)
    assert result.error is None, result.error
    assert result.output is not None
    if not script.already_distributed:
        assert result.changed, "a single-GPU training script converted to itself"


@pytest.mark.parametrize(
    "script", params("unchanged", [s for s in CORPUS if s.already_distributed])
)
def test_already_distributed_script_is_left_unchanged(script: CorpusScript) -> None:
    result = converted(script.name)
    assert result.output == script.source, f"changed a ChainerMN script:\n{result.diff()}"


@pytest.mark.slow  # converts the whole corpus in fresh interpreters: minutes
@pytest.mark.parametrize("script", params("deterministic"))
def test_conversion_is_deterministic(script: CorpusScript) -> None:
    first = output_of(script)
    again = convert_sources({str(script.path): script.source}, OPTIONS)[0]
    assert again.output == first, "a second conversion in the same process differs"
    for environment, outputs in converted_in_subprocesses().items():
        assert outputs[str(script.path)] == first, f"output differs under {environment}"


@pytest.mark.parametrize("script", params("idempotent"))
def test_conversion_is_idempotent(script: CorpusScript) -> None:
    first = output_of(script)
    second = convert_sources({str(script.path): first}, OPTIONS)[0]
    assert second.error is None, second.error
    assert second.output == first, f"converting the output again changed it:\n{second.diff()}"


def _signatures(source: str) -> Counter[str]:
    """Every def/class header (name, parameters, bases) in the file."""
    found: Counter[str] = Counter()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[f"def {node.name}({ast.unparse(node.args)})"] += 1
        elif isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in [*node.bases, *node.keywords])
            found[f"class {node.name}({bases})"] += 1
    return found


@pytest.mark.parametrize("script", params("compile"))
def test_output_compiles(script: CorpusScript) -> None:
    compile(output_of(script), str(script.path), "exec", dont_inherit=True)


@pytest.mark.parametrize("script", params("signatures"))
def test_output_keeps_every_signature(script: CorpusScript) -> None:
    """docs/design.md §0: no rewrite changes a function or class signature."""
    output = output_of(script)
    before, after = _signatures(script.source), _signatures(output)
    assert after == before, (
        f"signatures changed: removed {sorted((before - after).elements())}, "
        f"added {sorted((after - before).elements())}"
    )


def _innermost_loop(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    """The for/while loop closest around ``node`` within its function, if any."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return None
        if isinstance(node, ast.For | ast.AsyncFor | ast.While):
            return node
    return None


def _misplaced_scatters(source: str) -> list[str]:
    """``X = ...scatter_dataset(X, ...)`` inside a loop that never binds X otherwise: the data
    set is built once, before the loop, and scattered again on every pass (shards of shards)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    problems = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).endswith("scatter_dataset")
        ):
            continue
        target = node.targets[0]
        loop = _innermost_loop(node, parents)
        if loop is None:
            continue
        rebound = any(
            isinstance(n, ast.Name) and n.id == target.id and isinstance(n.ctx, ast.Store)
            for n in ast.walk(loop)
            if n is not target
        )
        if not rebound:
            problems.append(f"line {node.lineno}: {ast.unparse(node)}")
    return problems


@pytest.mark.parametrize("script", params("scatter"))
def test_output_scatters_each_dataset_once(script: CorpusScript) -> None:
    """A data set built before a loop is scattered before it, not on every pass."""
    assert _misplaced_scatters(script.source) == [], "the input itself re-scatters"
    problems = _misplaced_scatters(output_of(script))
    assert not problems, f"scatter_dataset inside a loop the data set was not built in: {problems}"


def _hazards(source: str, path: str) -> Counter[tuple[str, str]]:
    """MN301/MN302 findings keyed by code and the flagged line's text (lines move)."""
    lines = source.splitlines()
    return Counter(
        (d.code, lines[d.line - 1].strip())
        for d in lint_source(source, path, select=["MN301", "MN302"])
    )


@pytest.mark.parametrize("script", params("lint"))
def test_output_adds_no_collective_hazard(script: CorpusScript) -> None:
    output = output_of(script)
    new = _hazards(output, str(script.path)) - _hazards(script.source, str(script.path))
    assert not new, f"conversion introduced {sorted(new.elements())}"


@functools.cache
def single_run(name: str) -> tuple[subprocess.CompletedProcess[str], Path, Counter[str]]:
    """The original script run once as one plain process (cached: the e2e check compares its
    ranks with it): the process, its working directory, and the examples it trained on."""
    script = next(s for s in CORPUS if s.name == name)
    base = Path(tempfile.mkdtemp(prefix=f"mnify-corpus-{name}-"))
    inputs = base / "inputs"
    script.make_inputs(inputs)
    launcher = base / "launcher.py"
    launcher.write_text(launcher_source(base, script.path, script.argv(inputs)), encoding="utf-8")
    seen = base / "examples.json"
    run = subprocess.run(
        [sys.executable, str(launcher)],
        cwd=base,
        env=mpi_env({examples_seen.OUT_ENV: str(seen)}),
        capture_output=True,
        text=True,
        timeout=E2E_TIMEOUT,
    )
    counts = examples_seen.read(seen) if seen.exists() else Counter[str]()
    return run, base / "rank0", counts


@pytest.mark.slow  # trains every corpus script once as one process: minutes in all
@pytest.mark.parametrize("script", params("original"))
def test_original_runs_single_process(script: CorpusScript) -> None:
    run, workdir, examples = single_run(script.name)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    problems = writes_mismatch(files_under(workdir), script.writes)
    assert not problems, f"{problems}\n{run.stdout[-3000:]}"
    # what the e2e check calls the training set: examples seen once per epoch, at least twice
    trained = examples_seen.training_set(examples)
    if not script.examples_unchecked:
        assert trained, "the run trained on no example twice (declare examples_unchecked, and why)"


@pytest.mark.mpi
@pytest.mark.parametrize("script", params("e2e"))
def test_converted_runs_on_two_ranks(script: CorpusScript, tmp_path: Path) -> None:
    """The converted script on 2 ranks: it ends cleanly, rank 0 writes what the original writes,
    rank 1 writes nothing, and it is data parallel on the examples themselves: each rank trains
    on its own share of the examples the original trained on, together all of them."""
    output = output_of(script)
    code = tmp_path / "code" / script.path.name
    code.parent.mkdir()
    code.write_text(output, encoding="utf-8")
    inputs = tmp_path / "inputs"
    script.make_inputs(inputs)
    run = run_ranks(
        2,
        launcher_source(tmp_path, code, script.argv(inputs)),
        timeout=E2E_TIMEOUT,
        cwd=tmp_path,
        check=False,
        env={examples_seen.OUT_ENV: str(tmp_path / "examples.rank{rank}.json")},
    )
    assert not run.timed_out and run.returncode == 0, run.describe()[-12000:]
    rank1 = files_under(tmp_path / "rank1")
    assert rank1 == [], f"rank 1 wrote {rank1}"
    problems = writes_mismatch(files_under(tmp_path / "rank0"), script.writes)
    assert not problems, f"rank 0: {problems}\n{run.stdout[-3000:]}"
    if script.already_distributed or script.examples_unchecked:
        return  # a ChainerMN script splits its own data; or examples cannot be told apart
    single, _, examples = single_run(script.name)
    assert single.returncode == 0, single.stderr[-3000:]
    ranks = [examples_seen.read(tmp_path / f"examples.rank{r}.json") for r in range(2)]
    problems = examples_seen.check_shares(examples, ranks)
    assert not problems, "; ".join(problems)


@pytest.mark.mpi
@pytest.mark.parametrize(
    "script",
    [
        pytest.param(
            s,
            id=s.name,
            marks=[pytest.mark.xfail(strict=True, reason=VERIFY_FAILURES[s.name])]
            if s.name in VERIFY_FAILURES
            else [],
        )
        for s in CORPUS
        if s.name in VERIFIED
    ],
)
def test_converted_run_is_verified_data_parallel(script: CorpusScript, tmp_path: Path) -> None:
    """``MNIFY_VERIFY=3`` on 2 ranks (docs/verify.md): the verdict has no finding (no same data,
    equal parameters, every optimizer multi-node, rank 1 writes nothing) after 3 updates."""
    code = tmp_path / "code" / script.path.name
    code.parent.mkdir()
    code.write_text(script.source if script.already_distributed else output_of(script), "utf-8")
    inputs = tmp_path / "inputs"
    script.make_inputs(inputs)
    run = run_ranks(
        2,
        launcher_source(tmp_path, code, script.argv(inputs)),
        timeout=E2E_TIMEOUT,
        cwd=tmp_path,
        check=False,
        env=verify_env(),
    )
    assert not run.timed_out and run.returncode == 0, run.describe()[-12000:]
    verdict = verdict_of(run)
    assert verdict["updates"] > 0, f"no update verified\n{run.describe()[-6000:]}"
    assert findings_of(verdict) == []
    assert all(o["multi_node"] for o in verdict["optimizers"]), verdict["optimizers"]
