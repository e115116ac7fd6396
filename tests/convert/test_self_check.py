"""The converter proves its own output: the equivalence check, the deadlock check, determinism.

The equivalence check (``mnify.rewrites.verify``) is shown to fire by planting bugs in the
applier; the deadlock check by projects whose helpers start to reach collectives once converted.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import libcst as cst
import pytest

from mnify.converter import ConvertOptions, convert_source, convert_sources
from mnify.lint import lint_source, project_collectives
from mnify.rewrites.edits import ApplyEdits
from mnify.rewrites.verify import PlanRecords, VerificationError, check_output
from tests.convert.ast_checks import assert_has_expression, assert_no_name, is_statement, names_used

ROOT = Path(__file__).resolve().parents[2]

LOOP = textwrap.dedent(
    """\
    import argparse
    import chainer


    def evaluate(model, it):
        return 0.0


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--gpu', type=int, default=-1)
        args = parser.parse_args()
        train, test = chainer.datasets.get_mnist()
        train_iter = chainer.iterators.SerialIterator(train, 32)
        test_iter = chainer.iterators.SerialIterator(test, 32, repeat=False, shuffle=False)
        model = chainer.links.Classifier(chainer.links.Linear(None, 10))
        optimizer = chainer.optimizers.Adam()
        optimizer.setup(model)
        iteration = 0
        while train_iter.epoch < 2:
            batch = train_iter.next()
            iteration += 1
            if iteration % 20 == 0:
                print('iter', iteration)
            if train_iter.is_new_epoch:
                print('epoch', train_iter.epoch)
                acc = evaluate(model, test_iter)
                print('acc', acc)


    if __name__ == '__main__':
        main()
    """
)


def _loop_body(tree: ast.Module) -> list[ast.stmt]:
    main = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "main")
    loop = next(s for s in main.body if isinstance(s, ast.While))
    return loop.body


def test_sibling_ifs_stay_siblings() -> None:
    """The reported bug: the second user `if` was nested into the first one's guard."""
    result = convert_source(LOOP)
    assert result.error is None
    assert result.output is not None
    body = _loop_body(ast.parse(result.output))
    kinds = [type(s).__name__ for s in body]
    assert kinds == ["Assign", "AugAssign", "If", "If"]
    tests = [ast.unparse(s.test) for s in body if isinstance(s, ast.If)]
    assert tests == ["comm.rank == 0", "train_iter.is_new_epoch"]
    epoch_if = body[3]
    assert isinstance(epoch_if, ast.If)
    # the evaluation still runs on every rank, between two guarded prints
    assert [ast.unparse(s) for s in epoch_if.body][1] == "acc = evaluate(model, test_iter)"


@pytest.mark.parametrize(
    "env",
    [{"PYTHONMALLOC": "malloc"}, {"PYTHONHASHSEED": "0"}, {"PYTHONHASHSEED": "4242"}],
    ids=["malloc", "hashseed0", "hashseed4242"],
)
def test_output_is_the_same_under_any_allocator_and_hash_seed(env: dict[str, str]) -> None:
    code = (
        "import sys; from mnify.converter import convert_source; "
        "sys.stdout.write(convert_source(sys.stdin.read()).output)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        input=LOOP,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
        check=True,
    )
    assert run.stdout == convert_source(LOOP).output


# --------------------------------------------------------------------- planted applier bugs
def _nest_into_previous_if(
    self: ApplyEdits, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """The old bug, on purpose: a statement following an ``if`` lands inside that ``if``."""
    body = _REAL_BLOCK(self, original, updated)
    out: list[cst.BaseStatement] = []
    for stmt in body:
        prev = out[-1] if out else None
        user_if = isinstance(stmt, cst.If) and "is_new_epoch" in cst.Module(body=[]).code_for_node(
            stmt.test
        )
        if isinstance(prev, cst.If) and user_if and prev.orelse is None:
            assert isinstance(prev.body, cst.IndentedBlock)
            out[-1] = prev.with_changes(body=prev.body.with_changes(body=[*prev.body.body, stmt]))
        else:
            out.append(stmt)
    return out


def _drop_inserted(
    self: ApplyEdits, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """A statement the plan inserts is silently not emitted."""
    body = _REAL_BLOCK(self, original, updated)
    kept = [s for s in body if "scatter_dataset" not in cst.Module(body=[s]).code]
    return kept


_REAL_BLOCK = ApplyEdits._block


@pytest.mark.parametrize(
    ("planted", "words"),
    [(_nest_into_previous_if, "moved from under"), (_drop_inserted, "planned insertion")],
    ids=["nest", "drop-insertion"],
)
def test_planted_applier_bug_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, planted: object, words: str
) -> None:
    monkeypatch.setattr(ApplyEdits, "_block", planted)
    result = convert_source(LOOP, "train.py")
    assert result.output is None
    assert result.error is not None and result.error.startswith("internal:")
    assert words in result.error


def test_planted_bug_through_the_console_script_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "train.py"
    src.write_text(LOOP)
    out = tmp_path / "train_mn.py"
    code = (
        "import sys\n"
        "from mnify.rewrites.edits import ApplyEdits\n"
        "from tests.convert.test_self_check import _nest_into_previous_if\n"
        "ApplyEdits._block = _nest_into_previous_if\n"
        "from mnify.cli import main\n"
        "sys.argv = ['mnify', 'convert', sys.argv[1], '-o', sys.argv[2]]\n"
        "main()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(src), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 2, run.stderr
    first = run.stderr.splitlines()[0]
    assert first.startswith(f"error: internal: {src}:25: "), first
    assert "moved from under" in first
    assert "Traceback" not in run.stderr
    assert not out.exists()
    assert src.read_text() == LOOP


# --------------------------------------------------------------------- the check itself
def _records(**kw: object) -> PlanRecords:
    return PlanRecords(**kw)  # type: ignore[arg-type]


SMALL = "x = 1\nif x:\n    print(x)\ny = 2\n"


def test_check_accepts_planned_guard_and_insertion() -> None:
    out = "x = 1\nz = 0\nif x:\n    if comm.rank == 0:\n        print(x)\ny = 2\n"
    check_output(SMALL, out, _records(guarded={(3, "Expr"): ()}, inserted=["z = 0\n"]))


@pytest.mark.parametrize(
    ("out", "words"),
    [
        ("x = 1\nif x:\n    pass\ny = 2\n", "lost"),
        ("x = 1\nif x:\n    print(x)\n    y = 2\n", "moved from under the module to under `if x:`"),
        (
            "x = 1\nif comm.rank == 0:\n    if x:\n        print(x)\ny = 2\n",
            "moved from under the module to under `if comm.rank == 0:`",
        ),
        ("x = 1\nif x:\n    print(x)\nz = 0\ny = 2\n", "unplanned"),
        ("x = 2\nif x:\n    print(x)\ny = 2\n", "lost"),
    ],
    ids=["lost", "moved", "unplanned-guard", "unplanned-insert", "changed"],
)
def test_check_rejects_what_the_plan_does_not_say(out: str, words: str) -> None:
    with pytest.raises(VerificationError) as caught:
        check_output(SMALL, out, _records())
    assert words in caught.value.message


def test_check_rejects_a_missing_planned_guard_and_insertion() -> None:
    with pytest.raises(VerificationError, match="lost its planned rank guard"):
        check_output(SMALL, SMALL, _records(guarded={(3, "Expr"): ()}))
    with pytest.raises(VerificationError, match="planned insertion"):
        check_output(SMALL, SMALL, _records(inserted=["z = 0\n"]))


# --------------------------------------------------------------------- deadlocks
HELPERS = textwrap.dedent(
    """\
    import chainer
    import chainermn


    def load_test_iterator(batchsize, comm):
        if comm.rank == 0:
            _, test = chainer.datasets.get_mnist()
        else:
            test = None
        test = chainermn.scatter_dataset(test, comm)
        return chainer.iterators.SerialIterator(test, batchsize, repeat=False, shuffle=False)


    def accuracy(model, it):
        return sum(len(batch) for batch in it)
    """
)

# Half converted by hand: the communicator exists, the rest is still single-process.
TRAIN = textwrap.dedent(
    """\
    import argparse

    import chainer
    import chainer.links as L
    import chainermn
    from chainer import training
    from chainer.training import extensions

    from helpers import accuracy, load_test_iterator


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--batchsize', type=int, default=32)
        args = parser.parse_args()
        comm = chainermn.create_communicator('naive')
        model = L.Classifier(L.Linear(None, 10))
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
        train, _ = chainer.datasets.get_mnist()
        train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
        updater = training.StandardUpdater(train_iter, optimizer)
        trainer = training.Trainer(updater, (1, 'epoch'))
        trainer.extend(extensions.LogReport())
        trainer.run()
        print('test accuracy', accuracy(model, load_test_iterator(args.batchsize, comm)))


    if __name__ == '__main__':
        main()
    """
)


def _mn301(outputs: dict[str, str]) -> list[str]:
    external = project_collectives(outputs)
    return [
        f"{path}:{d.line}"
        for path, text in outputs.items()
        for d in lint_source(text, path, select=["MN301"], external_collectives=external)
    ]


def test_a_call_that_reaches_a_collective_is_not_guarded() -> None:
    """A print whose argument calls a helper in another file that scatters: guarding it would
    leave the other ranks out of the scatter. The first plan guards it, the project's MN301
    check finds the deadlock, and the second plan keeps it on every rank."""
    options = ConvertOptions(target="chainermn", leave_distributed=False)
    results = convert_sources({"proj/train.py": TRAIN, "proj/helpers.py": HELPERS}, options)
    assert [r.error for r in results] == [None, None]
    outputs = {r.path: r.output or "" for r in results}
    assert _mn301(outputs) == []
    main = next(
        s
        for s in ast.parse(outputs["proj/train.py"]).body
        if isinstance(s, ast.FunctionDef) and s.name == "main"
    )
    last = main.body[-1]
    assert is_statement(last, "print('test accuracy', ...)")
    # the rest was converted
    assert_has_expression(outputs["proj/train.py"], "chainermn.create_multi_node_optimizer(...)")
    notes = [e for r in results for e in r.entries if e.severity == "needs-person"]
    assert any("load_test_iterator" in e.message for e in notes)


def test_lint_follows_calls_into_other_files() -> None:
    guarded = TRAIN.replace(
        "    print('test accuracy'", "    if comm.rank == 0:\n        print('test accuracy'"
    )
    found = _mn301({"train.py": guarded, "helpers.py": HELPERS})
    assert len(found) == 1 and found[0].startswith("train.py:")
    assert _mn301({"train.py": guarded}) == []  # without the helper's file it is invisible


ALREADY = textwrap.dedent(
    """\
    import chainer
    import chainermn


    def main():
        comm = chainermn.create_communicator('naive')
        if comm.rank == 0:
            train, _ = chainer.datasets.get_mnist()
            debug_iter = chainer.iterators.SerialIterator(train, 8)
            print(debug_iter.next())
        else:
            train = None
        train = chainermn.scatter_dataset(train, comm)
        train_iter = chainer.iterators.SerialIterator(train, 8)


    if __name__ == '__main__':
        main()
    """
)


def test_an_already_distributed_script_is_left_unchanged_and_says_why() -> None:
    result = convert_source(ALREADY)
    assert result.error is None
    assert result.output == ALREADY
    assert result.skipped == "already distributed (it imports chainermn)"
    converted = convert_source(LOOP).output
    assert converted is not None
    again = convert_source(converted)
    assert again.output == converted and again.skipped is not None


def test_no_collective_is_inserted_under_an_existing_rank_check() -> None:
    result = convert_source(ALREADY, options=ConvertOptions(leave_distributed=False))
    assert result.error is None
    assert result.output is not None
    assert _mn301({"a.py": result.output}) == []
    tree = ast.parse(result.output)
    main = next(s for s in tree.body if isinstance(s, ast.FunctionDef))
    rank_if = next(s for s in main.body if isinstance(s, ast.If))
    assert "scatter_dataset" not in names_used(ast.unparse(rank_if))


LATER = textwrap.dedent(
    """\
    import argparse
    import chainer


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--small', action='store_true')
        args = parser.parse_args()
        for epoch in range(2):
            if epoch == 1:
                train_iter = chainer.iterators.SerialIterator(train, 2)
                print(train_iter.next())
            train = chainer.datasets.TupleDataset([1, 2], [3, 4])


    if __name__ == '__main__':
        main()
    """
)


def test_a_dataset_is_scattered_only_where_its_assignment_dominates() -> None:
    result = convert_source(LATER)
    assert result.error is None and result.output is not None
    assert_no_name(result.output, "scatter_dataset")
    notes = [e.message for e in result.entries if e.severity == "needs-person"]
    assert any("not surely assigned" in m for m in notes)


def test_a_report_claim_the_output_does_not_bear_out_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 12, pattern 11: the report is checked against the produced code."""
    from mnify.rewrites.edits import EditPlan

    real = EditPlan.guard_stmt

    def forgetful(self: EditPlan, stmt: cst.BaseStatement, guard: object) -> bool:
        if getattr(guard, "key", "") == "rank0":
            return True  # says it guarded, plans nothing: the report would lie
        return real(self, stmt, guard)  # type: ignore[arg-type]

    monkeypatch.setattr(EditPlan, "guard_stmt", forgetful)
    result = convert_source(LOOP, "train.py")
    assert result.output is None
    assert result.error is not None and "the output does not show it" in result.error


# Found by scripts/hypothesis_long.py: the rewrites themselves must be idempotent (a script
# converted again with the already-distributed detection off changes no more).
SECOND_PASS = {
    "scatter-index-is-a-scatter": "import chainer\n\ndef parse_args():\n    pass\n\ndef main():\n    args = parse_args()\n    optimizer = chainer.optimizers.Adam()\n    ds_train, ds_val = chainer.datasets.get_cifar100()\n    ds_train = chainer.datasets.TransformDataset(ds_train, lambda e: e)\n    train_it = chainer.iterators.SerialIterator(ds_train, args.batchsize)\n    val_it = chainer.iterators.SerialIterator(ds_val, args.batchsize, repeat=False, shuffle=False)\n",
    "no-guard-before-the-communicator": "import argparse\nimport chainer\n\ndef banner():\n    print('CUDA is available')\n\ndef parse_args():\n    parser = argparse.ArgumentParser(description='Chainer example')\n    return parser.parse_args()\n\ndef main():\n    banner()\n    opts = parse_args()\n    opt = chainer.optimizers.Adam()\n    try:\n        train = chainer.datasets.get_mnist()[0]\n        n_train = len(train)\n        train_it = chainer.iterators.MultiprocessIterator(train, opts.batchsize, n_processes=2)\n    except (IOError, OSError):\n        pass\n",
}


@pytest.mark.parametrize("name", sorted(SECOND_PASS))
def test_converting_again_changes_nothing_with_detection_off(name: str) -> None:
    options = ConvertOptions(leave_distributed=False)
    first = convert_source(SECOND_PASS[name], "t.py", options)
    assert first.error is None and first.output is not None, first.error
    second = convert_source(first.output, "t.py", options)
    assert second.error is None
    assert second.output == first.output, second.diff()
