"""Issue 31, items 2 and 6: the converter's decisions read what code does (its effects,
mnify/program/effects.py), whatever shape reaches them; and the report and the CLIs say only
what is true of the output. Asserted on the output's AST and the report's entries."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.convert.converting import convert_tree, install_package, main_body

ROOT = Path(__file__).resolve().parents[2]

# an installed library whose helper trains (a Trainer run inside it), as chainer-chemistry's
# run_train does; found on sys.path and read from its source, never imported
LIBRARY = {
    "molkit/__init__.py": "from molkit.training import fit_model\n",
    "molkit/report.py": """
        from chainer.training import extension

        class EpochPrinter(extension.Extension):
            def __call__(self, trainer):
                print(trainer.get_extension('LogReport').log[-1])
        """,
    "molkit/training.py": """
        import chainer
        from chainer import training
        from chainer.training import extensions

        def fit_model(model, train_iter, out='result', epoch=1):
            optimizer = chainer.optimizers.Adam()
            optimizer.setup(model)
            updater = training.StandardUpdater(train_iter, optimizer)
            trainer = training.Trainer(updater, (epoch, 'epoch'), out=out)
            trainer.extend(extensions.LogReport())
            trainer.run()
        """,
}

TRAIN = """\
import argparse
import json

import chainer
import chainer.links as L
from molkit import fit_model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--out', default='result')
    args = parser.parse_args()
    train, _ = chainer.datasets.get_mnist()
    model = L.Classifier(L.Linear(None, 10))
    it = chainer.iterators.SerialIterator(train, 32)
    fit_model(model, it, out=args.out)
    with open('summary.json', 'w') as f:
        json.dump({'done': True}, f)


if __name__ == '__main__':
    main()
"""

# a script of the same tree that trains nothing: it evaluates a saved model by hand and keeps
# its numbers in a dict (``.update`` of a dict is no training)
PREDICT = """\
import argparse

import chainer
import chainer.links as L


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--model', default='result/model.npz')
    args = parser.parse_args()
    _, test = chainer.datasets.get_mnist()
    model = L.Classifier(L.Linear(None, 10))
    chainer.serializers.load_npz(args.model, model)
    scores = {}
    it = chainer.iterators.SerialIterator(test, 100, repeat=False, shuffle=False)
    evaluator = chainer.training.extensions.Evaluator(it, model)
    scores.update(evaluator())
    print(scores)


if __name__ == '__main__':
    main()
"""


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_package(tmp_path / "site", LIBRARY, monkeypatch)


def test_a_library_helper_that_trains_is_distributed_and_a_dict_update_is_not_training(
    library: Path,
) -> None:
    results = convert_tree({"proj/train.py": TRAIN, "proj/predict.py": PREDICT})
    train = results["proj/train.py"]
    body = main_body(train.output)
    assert "mn.distribute_trainers(comm)" in body
    assert not any("trains nothing" in e.message for e in train.entries)
    # the file the script writes after training is rank 0's
    assert any(s.startswith("if comm.rank == 0:\n    with open('summary.json'") for s in body)
    predict = results["proj/predict.py"]
    assert not predict.changed
    assert [e.code for e in predict.entries] == ["MN801"]  # no MN505 for its evaluation


def test_a_sub_package_helper_that_writes_is_run_by_rank_0_and_its_subprocess_reported() -> None:
    helper = textwrap.dedent(
        """
        import os
        import subprocess


        def stamp_run(out):
            out = out.split(',')[0]
            if not os.path.isdir(out):
                os.mkdir(out)
            subprocess.call(['cp', 'train.py', out])
        """
    )
    train = TRAIN.replace("from molkit import fit_model", "from kit.stamp import stamp_run")
    train = train.replace(
        "    fit_model(model, it, out=args.out)\n",
        "    opt = chainer.optimizers.SGD()\n    opt.setup(model)\n",
    ).replace(
        "    args = parser.parse_args()\n",
        "    args = parser.parse_args()\n    stamp_run(args.out)\n",
    )
    results = convert_tree({"p/train.py": train, "p/kit/__init__.py": "", "p/kit/stamp.py": helper})
    result = results["p/train.py"]
    body = main_body(result.output)
    assert "if comm.rank == 0:\n    stamp_run(args.out)" in body
    forks = [e for e in result.entries if e.code == "MN203" and e.severity == "needs-person"]
    assert [e.line for e in forks] == [13]  # at the call in the user's file
    assert "subprocess.call" in forks[0].message


def test_a_helper_that_writes_and_returns_its_directory_is_run_by_rank_0_and_broadcast() -> None:
    """``out = make_run_dir(config) if not test else 'tmp'``: the value every rank needs comes
    from rank 0's call (``bcast_obj``), in whichever branch the call stands."""
    helper = textwrap.dedent(
        """
        import os
        import shutil


        def make_run_dir(config_path):
            out = os.path.join('results', os.path.basename(config_path).split('.')[0])
            os.makedirs(out)
            shutil.copy(config_path, out)
            return out
        """
    )
    train = TRAIN.replace("from molkit import fit_model", "from util.rundir import make_run_dir")
    train = train.replace(
        "    fit_model(model, it, out=args.out)\n",
        "    opt = chainer.optimizers.SGD()\n    opt.setup(model)\n"
        "    out = make_run_dir('cfg.yml') if not args.out else 'results/test'\n",
    )
    results = convert_tree(
        {"q/train.py": train, "q/util/__init__.py": "", "q/util/rundir.py": helper}
    )
    body = main_body(results["q/train.py"].output)
    want = (
        "out = comm.bcast_obj(make_run_dir('cfg.yml') if comm.rank == 0 else None) "
        "if not args.out else 'results/test'"
    )
    assert want in body


def test_a_pipeline_that_trains_through_a_class_kept_in_an_attribute_stays_on_every_rank() -> None:
    """``builder.run(...)`` makes its output directory (a write) and trains through a trainer
    class it keeps in ``self.trainer_class`` and calls: the analysis cannot tell what that
    call does, so the call is never put on rank 0 alone (every rank must train)."""
    pipeline = textwrap.dedent(
        """
        import os

        import chainer
        from chainer import training


        class FitStep:
            def __init__(self, out):
                self.out = out

            def __call__(self, model, it):
                opt = chainer.optimizers.SGD()
                opt.setup(model)
                updater = training.StandardUpdater(it, opt)
                training.Trainer(updater, (1, 'epoch'), out=self.out).run()


        class Pipeline:
            def __init__(self, trainer_class=None):
                self.trainer_class = trainer_class or FitStep

            def run(self, model, it, out):
                if not os.path.isdir(out):
                    os.mkdir(out)
                step = self.trainer_class(out)
                step(model, it)
        """
    )
    train = TRAIN.replace("from molkit import fit_model", "from pipeline import Pipeline")
    train = train.replace(
        "    fit_model(model, it, out=args.out)\n",
        "    Pipeline().run(model, it, args.out)\n",
    )
    results = convert_tree({"r/train.py": train, "r/pipeline.py": pipeline})
    body = main_body(results["r/train.py"].output)
    assert "Pipeline().run(model, it, args.out)" in body


def test_a_log_report_a_package_extension_may_read_stays_on_every_rank(library: Path) -> None:
    """A package's extension registered next to the LogReport may read it on every rank: the
    LogReport stays on every rank, only its file is rank 0's."""
    train = TRAIN.replace(
        "from molkit import fit_model",
        "from chainer import training\nfrom chainer.training import extensions\n"
        "from molkit.report import EpochPrinter",
    ).replace(
        "    fit_model(model, it, out=args.out)\n",
        "    opt = chainer.optimizers.SGD()\n    opt.setup(model)\n"
        "    trainer = training.Trainer(training.StandardUpdater(it, opt), (1, 'epoch'))\n"
        "    trainer.extend(extensions.LogReport())\n"
        "    trainer.extend(EpochPrinter())\n"
        "    trainer.run()\n",
    )
    converted = convert_tree({"s/train.py": train})["s/train.py"]
    body = main_body(converted.output)
    assert (
        "trainer.extend(extensions.LogReport(log_name='log' if comm.rank == 0 else None))" in body
    )
    # the package's extension stays on every rank (it may change what every rank shares) and
    # prints on rank 0 only
    assert "trainer.extend(mn.quiet_on_other_ranks(EpochPrinter(), comm))" in body
    said = [e.message for e in converted.entries if "EpochPrinter" in e.message]
    assert said and "prints on rank 0 only" in said[0], said
    # converting the output again changes nothing
    again = convert_tree({"s/train.py": converted.output or ""})["s/train.py"]
    assert again.output == converted.output


def test_an_empty_tree_is_an_error(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "notes").mkdir(parents=True)
    (tree / "notes" / "readme.txt").write_text("no code here\n")
    run = subprocess.run(
        [sys.executable, "-m", "mnify", "convert", str(tree), "--outtree", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 2, run.stderr
    assert "no Python file" in run.stderr and "next:" not in run.stderr
    assert not (tmp_path / "o").exists()


def test_lint_says_a_script_without_a_communicator_runs_as_one_process(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    run = subprocess.run(
        [sys.executable, "-m", "mnify", "lint", str(script)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert "single process" in run.stderr and "mnify convert" in run.stderr, run.stderr
    converted = tmp_path / "train_mn.py"
    converted.write_text(
        "from mnify import runtime as mn\nimport chainer\ncomm = mn.create_communicator()\n"
    )
    again = subprocess.run(
        [sys.executable, "-m", "mnify", "lint", str(converted)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert "single process" not in again.stderr
