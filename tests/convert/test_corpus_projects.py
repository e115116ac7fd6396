"""The converter on realistic multi-file Chainer projects (issue 12), one test id per project.

``fixtures/corpus/projects/<name>/`` are small research-style projects (GAN library, detection
with mAP, segmentation with mIoU, word2vec, PTB language model, seq2seq with BLEU ...), written
the way public Chainer code is written rather than in the converter's own fixture style. Each is
converted as ``mnify convert DIR`` would (all its .py files together), then run on 2 ranks: the
run must succeed, be data parallel, write its files on rank 0 only, and run the post-training
tail once.

Where the converter is known to get a project wrong, the project is listed in
:data:`CONVERT_FAILURES` or :data:`E2E_FAILURES` with what goes wrong; those tests are strict
xfails, so a converter fix flips them and CI says so.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mnify.converter import ConvertOptions, convert_sources
from tests.convert.projects_support import (
    Project,
    convert,
    convert_elsewhere,
    evaluator_mismatches,
    files_under,
    install,
    load_projects,
    marker_count,
    probe_of,
    probes,
    rank_examples,
    run_on_ranks,
    run_single,
    single_examples,
    stale_model_files,
)
from tests.support import examples_seen
from tests.support.examples_seen import check_shares
from tests.support.verdict import findings_of, verdict_of, verify_env

PROJECTS = load_projects()
ISSUE_12_PATTERNS = set(range(1, 13)) - {11}

# project -> what the converter does wrong when converting it (crash, error, output changes on
# a second conversion, nondeterminism)
CONVERT_FAILURES: dict[str, str] = {}

# project -> what goes wrong when the converted project runs on 2 ranks (exit status, rank 1
# writes, the tail runs twice, a deadlock, training that is not data parallel); the first
# failure the run hits comes first, with the issue 12 pattern number
E2E_FAILURES: dict[str, str] = {}

# Projects that also run under ``--verify`` on 2 ranks (docs/verify.md), one per way the
# training is reached: hand-written loops split across modules, a training helper, a config-built
# Trainer, a GAN's two optimizers, a pipeline class whose ``__call__`` makes the Trainer
# (converted at run time), an experiment helper of another module that makes the result directory
# and a dictConfig log file. A few short runs (each stops after 3 updates), not a second pass over
# every project.
VERIFIED = (
    "handloop_v1_package",
    "handloop_split_modules",
    "competition_handloop",
    "helper_trainer",
    "config_classifier",
    "gan_resblocks",
    "pipeline_job",
    "experiment_outdir",
)
# (chainermn_already imports ChainerMN itself, whose create_communicator starts no verification)
# project -> why its verified run has a finding the converter cannot fix (strict xfails)
VERIFY_FAILURES: dict[str, str] = {}


def _params(known: dict[str, str]) -> list[pytest.ParameterSet]:
    out = []
    for project in PROJECTS:
        reason = known.get(project.name)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(project, id=project.name, marks=marks))
    return out


def test_corpus_has_the_projects_issue_12_asks_for() -> None:
    assert len(PROJECTS) >= 13
    covered = set().union(*(p.patterns for p in PROJECTS))
    assert covered == ISSUE_12_PATTERNS, sorted(ISSUE_12_PATTERNS - covered)
    for table in (CONVERT_FAILURES, E2E_FAILURES):
        assert set(table) <= {p.name for p in PROJECTS}, "known failure for a missing project"
    assert set(VERIFIED) <= {p.name for p in RUNNABLE} and set(VERIFY_FAILURES) <= set(VERIFIED)


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_case_file_describes_a_runnable_project(project: Project) -> None:
    sources = project.sources()
    assert 2 <= len(sources) <= 8, f"{len(sources)} .py files"
    assert str(project.root / project.entry) in sources
    assert project.writes and project.tail_marker.strip()
    assert set(project.patterns) <= ISSUE_12_PATTERNS
    if project.setup is not None:
        assert (project.root / project.setup).is_file()
    for text in sources.values():
        ast.parse(text)  # the originals are Python 3


@pytest.mark.parametrize("project", _params(CONVERT_FAILURES))
def test_project_converts_cleanly(project: Project) -> None:
    """No error; output compiles; a second conversion changes nothing; same bytes every time."""
    sources = project.sources()
    first = convert(sources)
    assert list(first) == list(sources)
    for path, text in first.items():
        compile(text, path, "exec", dont_inherit=True)
    if project.distributed:
        assert first == sources, "an already distributed project must be left as it is"
    elif project.needs_person is not None:
        assert first == sources, "a project mnify cannot parallelise must be left as it is"
        said = [e.message for r in convert_sources(sources, ConvertOptions()) for e in r.entries]
        assert any(project.needs_person in m for m in said), said
    else:
        entry = str(project.root / project.entry)
        assert first[entry] != sources[entry], "the entry point was not converted"
    assert convert(first) == first, "converting the output again changed it"
    assert convert(sources) == first, "two conversions of the same input differ"
    assert convert_elsewhere(project, hash_seed=12345) == first, "output depends on hash seed"


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_original_project_runs(project: Project, tmp_path: Path) -> None:
    """The unconverted project trains and runs its tail once: it is a real project.

    It runs under the same launcher and probe as the converted one, so the case file's
    expectations (files, tail marker, final model files) are checked against the original.
    """
    installed = install(project, project.sources(), tmp_path / "code")
    run = run_single(project, installed, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    for pattern in project.writes:
        assert list((tmp_path / "rank0").glob(pattern)), f"did not write {pattern}"
    assert marker_count(run.stdout.splitlines(), project.tail_marker) == 1, run.stdout
    probe = probe_of(run.stdout.splitlines())
    assert probe["params"]
    assert probe["datasets"] or not project.examples_unchecked, "no training data seen"
    if not project.examples_unchecked:
        seen = examples_seen.read(tmp_path / "examples.json")
        assert examples_seen.training_set(seen), "no example trained on twice"
    assert stale_model_files(tmp_path / "rank0", project.final_models, probe["params"]) == []
    assert evaluator_mismatches(probe) == []


RUNNABLE = [p for p in PROJECTS if p.needs_person is None]


@pytest.mark.mpi
@pytest.mark.parametrize(
    "project",
    [
        pytest.param(
            p,
            id=p.name,
            marks=[pytest.mark.xfail(strict=True, reason=r)]
            if (r := {**CONVERT_FAILURES, **E2E_FAILURES}.get(p.name))
            else [],
        )
        for p in RUNNABLE
    ],
)
def test_converted_project_runs_on_two_ranks(project: Project, tmp_path: Path) -> None:
    installed = install(project, convert(project.sources()), tmp_path / "code")
    run = run_on_ranks(project, installed, tmp_path, n=2)
    assert not run.timed_out, f"deadlock or hang\n{run.describe()}"
    assert run.returncode == 0, run.describe()
    assert files_under(tmp_path / "rank1") == [], "rank 1 wrote files"
    for pattern in project.writes:
        assert list((tmp_path / "rank0").glob(pattern)), f"rank 0 did not write {pattern}"
    tails = marker_count(run.rank_lines(0) + run.rank_lines(1), project.tail_marker)
    assert tails == 1, f"post-training tail ran {tails} times\n{run.describe()}"
    rank0, rank1 = probes(run, 2)
    assert rank0["params"], "no optimizer was set up"
    assert rank0["params"] == rank1["params"], "ranks ended with different parameters"
    # a hand-written loop has no training iterator: then the examples check below decides
    assert (rank0["datasets"] and rank1["datasets"]) or not project.examples_unchecked, (
        "no training iterator seen, and the examples each rank saw are not compared"
    )
    shared = [d for d in rank1["datasets"] if d in rank0["datasets"]]
    assert not shared, f"ranks trained on the same data {shared}: not data parallel"
    stale = stale_model_files(tmp_path / "rank0", project.final_models, rank0["params"])
    assert stale == [], f"{len(stale)} saved arrays are not the trained parameters: {stale[:4]}"
    wrong = evaluator_mismatches(rank0)
    assert wrong == [], f"evaluators report other values than over the whole set: {wrong}"
    if not project.examples_unchecked:
        # data parallel on the examples themselves: disjoint shares of the original's examples
        problems = check_shares(single_examples(project), rank_examples(tmp_path, 2))
        assert not problems, "; ".join(problems)


@pytest.mark.mpi
@pytest.mark.parametrize(
    "project",
    [
        pytest.param(
            p,
            id=p.name,
            marks=[pytest.mark.xfail(strict=True, reason=VERIFY_FAILURES[p.name])]
            if p.name in VERIFY_FAILURES
            else [],
        )
        for p in RUNNABLE
        if p.name in VERIFIED
    ],
)
def test_converted_project_is_verified_data_parallel(project: Project, tmp_path: Path) -> None:
    """``MNIFY_VERIFY=3`` on 2 ranks: the verdict has no finding after 3 updates (no same data,
    equal parameters, every optimizer multi-node, rank 1 writes nothing)."""
    installed = install(project, convert(project.sources()), tmp_path / "code")
    run = run_on_ranks(project, installed, tmp_path, n=2, env=verify_env())
    assert not run.timed_out and run.returncode == 0, run.describe()[-12000:]
    verdict = verdict_of(run)
    assert verdict["updates"] > 0, f"no update verified\n{run.describe()[-6000:]}"
    assert findings_of(verdict) == []
    assert all(o["multi_node"] for o in verdict["optimizers"]), verdict["optimizers"]
