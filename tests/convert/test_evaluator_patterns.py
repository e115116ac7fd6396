"""Issue 12, pattern 5: evaluators whose metric is not a mean, and evaluation iterators
without ``reset()``.

Conversion: an Evaluator subclass of the file that overrides ``evaluate`` (directly or through
another class of the file) and the library evaluators of ``vocab.WHOLE_SET_EVALUATORS`` are
wrapped with ``gather=True`` under ``--target mnify``; under ``--target chainermn`` they stay
unwrapped and the report says whether their test set is (wrongly) scattered. End to end: the
converted fixtures report, on 2 and 3 ranks, exactly the metric one process computes over the
whole test set with the weights rank 0 saved.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import libcst as cst
import numpy as np
import pytest
from libcst.metadata import MetadataWrapper

from mnify.converter import ConvertOptions, convert_source, convert_sources
from mnify.converter.driver import FileResult
from mnify.program.walk import walk_program
from mnify.rewrites.context import FileContext
from mnify.rewrites.evaluator import (
    evaluator_classes,
    full_test_iterators,
    gathered_test_iterators,
    gathers_test_set,
    keeps_full_test_set,
)
from tests.convert.ast_checks import (
    assert_has_expression,
    assert_has_statement,
    assert_no_keyword,
    assert_no_name,
    find_statements,
)
from tests.convert.cases import BY_NAME, FIXTURES
from tests.convert.converting import convert
from tests.convert.test_e2e import _converted, _install, _run_on_ranks

HEAD = """\
import argparse
import copy

import chainer
from chainer import training
from chainer.training import extensions
"""

MAIN = """

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--batchsize', type=int, default=8)
    args = parser.parse_args()
    model = chainer.links.Classifier(chainer.links.Linear(4, 2))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    train, test = chainer.datasets.get_mnist()
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (1, 'epoch'))
{extends}
    trainer.run()
"""


def script(classes: str = "", extends: str = "", head: str = HEAD) -> str:
    body = textwrap.indent(textwrap.dedent(extends), "    ")
    return head + textwrap.dedent(classes) + MAIN.replace("{extends}", body.rstrip("\n"))


def evaluator_entries(result: FileResult) -> list[tuple[str, str]]:
    return [(e.severity, e.message) for e in result.entries if e.step == "evaluator"]


def extend_lines(text: str) -> list[str]:
    """Each ``trainer.extend(...)`` statement of the output, joined onto one line."""
    module = cst.parse_module(text)
    found: list[str] = []

    class Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "extend":
                found.append(" ".join(module.code_for_node(node).split()))

    module.visit(Visitor())
    return found


OVERRIDES = """

class MapEvaluator(extensions.Evaluator):
    def evaluate(self):
        return {}


class FromMap(MapEvaluator):
    pass


class OnlyInit(extensions.Evaluator):
    def __init__(self, iterator, target):
        super(OnlyInit, self).__init__(iterator, target)
"""


def test_evaluate_overrides_gather_and_plain_subclasses_average() -> None:
    source = script(
        OVERRIDES,
        """\
        trainer.extend(MapEvaluator(test_iter, model))
        trainer.extend(FromMap(test_iter, model), name='from_map')
        trainer.extend(OnlyInit(test_iter, model), name='only_init')
        trainer.extend(extensions.Evaluator(test_iter, model), name='plain')
        """,
    )
    result = convert(source)
    assert extend_lines(result.output or "") == [
        "trainer.extend(mn.create_multi_node_evaluator( MapEvaluator(test_iter, model), comm, gather=True))",
        "trainer.extend(mn.create_multi_node_evaluator( FromMap(test_iter, model), comm, gather=True), name='from_map')",
        "trainer.extend(mn.create_multi_node_evaluator(OnlyInit(test_iter, model), comm), name='only_init')",
        "trainer.extend(mn.create_multi_node_evaluator(extensions.Evaluator(test_iter, model), comm), name='plain')",
    ]
    entries = evaluator_entries(result)
    assert [s for s, _ in entries] == ["changed"] * 4
    assert "MapEvaluator overrides evaluate()" in entries[0][1]
    assert "rank 0 computes the metric over all shards' predictions" in entries[0][1]
    assert "FromMap overrides evaluate()" in entries[1][1]
    # converting the output again changes nothing, even with the distributed check off
    again = convert(result.output or "", leave_distributed=False)
    assert again.output == result.output


@pytest.mark.parametrize(
    ("imports", "construction"),
    [
        ("from chainercv.extensions import DetectionVOCEvaluator\n", "DetectionVOCEvaluator"),
        ("import chainercv\n", "chainercv.extensions.SemanticSegmentationEvaluator"),
        (
            "from chainer_chemistry.training.extensions import roc_auc_evaluator\n",
            "roc_auc_evaluator.ROCAUCEvaluator",
        ),
    ],
)
def test_library_evaluators_whose_metric_is_not_a_mean_gather(
    imports: str, construction: str
) -> None:
    source = script(
        extends=f"trainer.extend({construction}(test_iter, model))\n", head=HEAD + imports
    )
    result = convert(source)
    assert_has_statement(
        result.output or "",
        f"trainer.extend(mn.create_multi_node_evaluator({construction}(test_iter, model), comm,"
        " gather=True))",
        within="main",
    )
    ((severity, message),) = evaluator_entries(result)
    assert severity == "changed" and "over the whole test set" in message


def test_subclass_of_a_library_evaluator_gathers() -> None:
    source = script(
        """

class VOCWithDifficult(DetectionVOCEvaluator):
    pass
""",
        "trainer.extend(VOCWithDifficult(test_iter, model))\n",
        head=HEAD + "from chainercv.extensions import DetectionVOCEvaluator\n",
    )
    assert_has_statement(
        convert(source).output or "",
        "trainer.extend(mn.create_multi_node_evaluator(VOCWithDifficult(test_iter, model), comm,"
        " gather=True))",
        within="main",
    )


def test_noqa_leaves_the_evaluator_alone() -> None:
    source = script(OVERRIDES, "trainer.extend(MapEvaluator(test_iter, model))  # noqa: MN505\n")
    result = convert(source)
    text = result.output or ""
    (kept,) = assert_has_statement(text, "trainer.extend(MapEvaluator(test_iter, model))")
    assert text.splitlines()[kept.lineno - 1].endswith("  # noqa: MN505")
    assert evaluator_entries(result) == []


def test_evaluator_added_by_a_helper_is_converted_after_the_helper_runs() -> None:
    """The helper has no ``comm`` and keeps its signature: ``distribute_extensions`` after its
    call converts what it registered (a MapEvaluator overrides evaluate: gathered at run time)."""
    source = script(
        OVERRIDES
        + """

def add_evaluator(trainer, it, model):
    trainer.extend(MapEvaluator(it, model))
""",
        "add_evaluator(trainer, test_iter, model)\n",
    )
    result = convert(source)
    lines = [line.strip() for line in (result.output or "").splitlines()]
    at = lines.index("add_evaluator(trainer, test_iter, model)")
    assert lines[at + 1] == "mn.distribute_extensions(trainer, comm)"
    # the helper keeps its signature and its body
    assert_has_statement(
        result.output or "",
        "def add_evaluator(trainer, it, model):\n    trainer.extend(MapEvaluator(it, model))",
    )
    ((severity, message),) = [e for e in evaluator_entries(result) if "add_evaluator" in e[1]]
    assert severity == "changed"
    assert [e for e in result.entries if e.severity == "needs-person"] == []


def test_evaluator_added_by_a_helper_needs_a_person_under_chainermn() -> None:
    source = script(
        OVERRIDES
        + """

def add_evaluator(trainer, it, model):
    trainer.extend(extensions.Evaluator(it, model))
""",
        "add_evaluator(trainer, test_iter, model)\n",
    )
    result = convert(source, target="chainermn")
    assert_no_name(result.output or "", "distribute_extensions")
    ((severity, message),) = [e for e in evaluator_entries(result) if "cannot be passed" in e[1]]
    assert severity == "needs-person"
    assert "chainermn.create_multi_node_evaluator(..., comm)" in message


def test_chainermn_target_leaves_whole_set_evaluators_unwrapped_and_says_so() -> None:
    source = script(
        OVERRIDES,
        """\
        trainer.extend(MapEvaluator(test_iter, model))
        trainer.extend(extensions.Evaluator(test_iter, model), name='plain')
        """,
    )
    result = convert(source, target="chainermn")
    lines = extend_lines(result.output or "")
    assert lines[0] == "trainer.extend(MapEvaluator(test_iter, model))"
    assert_no_keyword(result.output or "", "gather")
    assert_has_statement(
        result.output or "",
        "trainer.extend(chainermn.create_multi_node_evaluator("
        "extensions.Evaluator(test_iter, model), comm), name='plain')",
        within="main",
    )
    (whole,) = [e for e in evaluator_entries(result) if "MapEvaluator" in e[1]]
    scattered = bool(
        find_statements(result.output or "", "test = chainermn.scatter_dataset(test, comm)")
    )
    # the report says what the output does: a scattered test set needs a person
    if scattered:
        assert whole[0] == "needs-person" and "is scattered" in whole[1]
    else:
        assert whole[0] == "info" and "not scattered" in whole[1]


def test_an_averaged_whole_set_evaluator_is_made_to_gather() -> None:
    """With the already-distributed check off (as ``mnify lint --fix`` runs): mnify's wrapper
    gets ``gather=True``; ChainerMN's cannot, and the report says so."""
    distributed = (
        HEAD
        + "from mnify import runtime as mn\n"
        + textwrap.dedent(OVERRIDES)
        + textwrap.dedent(
            """

        def main():
            comm = mn.create_communicator('flat')
            trainer = make_trainer(comm)
            trainer.extend(mn.create_multi_node_evaluator(MapEvaluator(test_iter, model), comm))
            trainer.extend(mn.create_multi_node_evaluator(OnlyInit(test_iter, model), comm))
        """
        )
    )
    result = convert(distributed, leave_distributed=False)
    assert extend_lines(result.output or "") == [
        "trainer.extend(mn.create_multi_node_evaluator(MapEvaluator(test_iter, model), comm, gather=True))",
        "trainer.extend(mn.create_multi_node_evaluator(OnlyInit(test_iter, model), comm))",
    ]
    assert convert(result.output or "", leave_distributed=False).output == result.output
    assert convert(distributed).output == distributed  # left alone by default
    chainermn = distributed.replace("from mnify import runtime as mn", "import chainermn as mn")
    result = convert(chainermn, leave_distributed=False)
    assert_no_keyword(result.output or "", "gather")
    (entry,) = [e for e in evaluator_entries(result) if e[0] == "needs-person"]
    assert "GenericMultiNodeEvaluator" in entry[1]


def _context(source: str, **options: Any) -> FileContext:
    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    program = walk_program(wrapper, "train.py")
    return FileContext("train.py", "train", source, program, ConvertOptions(**options))


def test_which_test_iterators_keep_the_whole_set() -> None:
    source = script(
        OVERRIDES,
        """\
        trainer.extend(MapEvaluator({'main': test_iter}, model))
        trainer.extend(OnlyInit(train_iter, model), name='only_init')
        trainer.extend(FromMap(chainer.iterators.SerialIterator(test, 4, repeat=False), model))
        """,
    )
    ctx = _context(source)
    assert evaluator_classes(ctx) == {"MapEvaluator": True, "FromMap": True, "OnlyInit": False}
    assert full_test_iterators(ctx) == set()
    assert gathered_test_iterators(ctx) == {"test_iter"}
    chainermn = _context(source, target="chainermn")
    assert full_test_iterators(chainermn) == {"test_iter"}
    assert gathered_test_iterators(chainermn) == set()
    iterators = [c for c in chainermn.facts.calls if c.qname.endswith("SerialIterator")]
    kept = [keeps_full_test_set(chainermn, c) for c in iterators]
    assert kept == [False, True, True]  # train_iter, test_iter, the inline one
    assert [gathers_test_set(chainermn, c) for c in iterators] == [False, False, False]
    own = [c for c in ctx.facts.calls if c.qname.endswith("SerialIterator")]
    assert [keeps_full_test_set(ctx, c) for c in own] == [False, False, False]
    assert [gathers_test_set(ctx, c) for c in own] == [False, True, True]
    model_parallel = _context(source, model_parallel="channel", target="chainermn")
    assert full_test_iterators(model_parallel) == set()


# ---------------------------------------------------------------------------- end to end
def _fixture_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"fixture_{name}", FIXTURES / f"{name}.in.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _last_log(path: Path) -> dict[str, float]:
    entries = json.loads(path.read_text())
    assert entries, "empty log"
    return entries[-1]  # type: ignore[no-any-return]


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_converted_detection_reports_the_whole_test_set_map(ranks: int, tmp_path: Path) -> None:
    """The converted detection script's logged mAP is the one-process mAP of the test set
    with the weights rank 0 saved (evaluation and snapshot see the same weights)."""
    import chainer

    case = BY_NAME["detection_map"]
    outputs = _converted(case)
    (text,) = outputs.values()
    assert_has_expression(text, "mn.create_multi_node_evaluator(..., comm, gather=True)")
    n, batch = 36, 4
    args = ["--synthetic", str(n), "--batchsize", str(batch), "--epoch", "1", "--out", "result"]
    run = _run_on_ranks(ranks, _install(case, outputs, tmp_path / "code"), args, tmp_path)
    assert run.returncode == 0, run.output
    logged = _last_log(tmp_path / "rank0" / "result" / "log")
    fixture = _fixture_module("detection_map")
    detector = fixture.TinyDetector(n_fg_class=len(fixture.LABEL_NAMES))
    chainer.serializers.load_npz(tmp_path / "rank0" / "result" / "detector_epoch_1", detector)
    test = fixture.synthetic_detection(max(n // 4, 4), 1)
    evaluator = fixture.DetectionMAPEvaluator(
        chainer.iterators.SerialIterator(test, batch, repeat=False, shuffle=False),
        detector,
        label_names=fixture.LABEL_NAMES,
    )
    evaluator.name = "validation"
    reporter = chainer.Reporter()
    reporter.add_observer("validation/main", detector)
    with reporter:
        expected = {k: float(v) for k, v in evaluator().items()}
    assert expected["validation/main/map"] == logged["validation/main/map"], (expected, logged)
    for name in fixture.LABEL_NAMES:
        key = f"validation/main/ap/{name}"
        assert np.isclose(expected[key], logged[key], equal_nan=True, rtol=0, atol=0), key


@pytest.mark.mpi
def test_converted_no_reset_iterator_evaluates_every_example(tmp_path: Path) -> None:
    """The user's evaluation iterator has no reset(): each evaluation copies it, so every
    epoch's validation loss is the loss over the whole test set (per example), never empty."""
    import chainer
    import chainer.functions as F

    case = BY_NAME["eval_iterator_no_reset"]
    outputs = _converted(case)
    args = ["--length", "300", "--batchsize", "8", "--epoch", "2", "--unit", "8", "--out", "result"]
    run = _run_on_ranks(2, _install(case, outputs, tmp_path / "code"), args, tmp_path)
    assert run.returncode == 0, run.output
    log = json.loads((tmp_path / "rank0" / "result" / "log").read_text())
    assert [e["epoch"] for e in log] == [1, 2]
    assert all("validation/main/loss" in e for e in log)
    fixture = _fixture_module("eval_iterator_no_reset")
    model = fixture.WindowRegressor(16, 8)
    chainer.serializers.load_npz(tmp_path / "rank0" / "result" / "regressor.npz", model)
    rng = np.random.RandomState(0)
    signal = np.sin(np.arange(300) * 0.07) + 0.1 * rng.randn(300)
    test = fixture.make_windows(signal[240:], 16)
    x, t = chainer.dataset.concat_examples(test[:])
    with chainer.no_backprop_mode(), chainer.using_config("train", False):
        y = model.l2(F.tanh(model.l1(x)))
    expected = float(np.mean((y.array - t) ** 2))
    np.testing.assert_allclose(log[-1]["validation/main/loss"], expected, rtol=1e-5)


def test_fixtures_are_converted_as_the_pattern_says() -> None:
    detection = convert_sources(
        {"detection_map.in.py": (FIXTURES / "detection_map.in.py").read_text()}
    )[0]
    assert detection.error is None
    assert_has_expression(
        detection.output or "",
        "mn.create_multi_node_evaluator("
        "DetectionMAPEvaluator(test_iter, detector, label_names=LABEL_NAMES), comm, gather=True)",
    )
    no_reset = BY_NAME["eval_iterator_no_reset"]
    (text,) = _converted(no_reset).values()
    assert_has_expression(
        text, "mn.create_multi_node_evaluator(extensions.Evaluator(test_iter, model), comm)"
    )
    options = dataclasses.replace(no_reset.options, target="chainermn")
    chainermn = convert_sources(
        {"detection_map.in.py": (FIXTURES / "detection_map.in.py").read_text()}, options
    )[0]
    assert chainermn.error is None
    assert_no_keyword(chainermn.output or "", "gather")


INLINE_EVALUATOR = textwrap.dedent(
    """\
    import argparse
    import chainer
    import chainer.links as L
    from chainer import training
    from chainer.training import extensions


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--gpu', type=int, default=-1)
        args = parser.parse_args()
        train, test = chainer.datasets.get_mnist()
        model = L.Classifier(L.Linear(784, 10))
        opt = chainer.optimizers.Adam()
        opt.setup(model)
        it = chainer.iterators.SerialIterator(train, 100)
        test_iter = chainer.iterators.SerialIterator(test, 100, repeat=False, shuffle=False)
        updater = training.StandardUpdater(it, opt, device=args.gpu)
        trainer = training.Trainer(updater, (1, 'epoch'))
        trainer.run()
        result = extensions.Evaluator(test_iter, model, device=args.gpu)()
        print(result)


    main()
    """
)


def test_inline_evaluator_call_is_wrapped_once() -> None:
    """Issue 22: ``Evaluator(...)()`` after training: the evaluator (the inner call) is wrapped,
    and the wrapped evaluator is what is called (was: a second wrap around the result dict)."""
    import ast

    result = convert_source(INLINE_EVALUATOR, "train.py")
    assert result.error is None, result.error
    tree = ast.parse(result.output or "")
    assign = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "result"
    )
    call = assign.value
    assert isinstance(call, ast.Call) and not call.args  # calling the evaluator
    wrapper = call.func
    assert isinstance(wrapper, ast.Call)
    assert ast.unparse(wrapper.func) == "mn.create_multi_node_evaluator"
    inner = wrapper.args[0]
    assert isinstance(inner, ast.Call) and ast.unparse(inner.func) == "extensions.Evaluator"
    wraps = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("create_multi_node_evaluator")
    ]
    assert len(wraps) == 1


def test_lint_reports_an_inline_evaluator_once_and_not_after_the_fix() -> None:
    from mnify.lint import lint_source

    distributed = INLINE_EVALUATOR.replace(
        "def main():\n",
        "import chainermn\n\n\ndef main():\n    comm = chainermn.create_communicator()\n",
    )
    found = [d for d in lint_source(distributed, "train.py", select=["MN505"])]
    assert [(d.code, d.line) for d in found] == [("MN505", 25)]
    fixed = convert_source(INLINE_EVALUATOR, "train.py").output or ""
    assert lint_source(fixed, "train.py", select=["MN505"]) == []
