"""The API the converter uses: lint_source, lint_wrapper, Diagnostic, LintSyntaxError."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider, ScopeProvider

from mnify.lint import Diagnostic, LintSyntaxError, SelectorError, lint_source, lint_wrapper

SCRIPT = """\
import chainermn
from chainer.training import extensions

comm = chainermn.create_communicator()
trainer.extend(extensions.LogReport())
trainer.extend(
    extensions.PrintReport(['epoch']),
)
"""


def test_diagnostic_fields_are_one_based_with_exclusive_end() -> None:
    found = lint_source(SCRIPT, "train.py")
    assert found[0] == Diagnostic(
        path="train.py",
        line=5,
        col=16,
        code="MN401",
        message=found[0].message,
        end_line=5,
        end_col=38,
        fixable=True,
    )
    assert "LogReport" in found[0].message
    # a finding spanning lines keeps its real end
    assert (found[1].line, found[1].col, found[1].end_line) == (7, 5, 7)


def test_select_and_ignore_keywords() -> None:
    assert lint_source(SCRIPT, "train.py", ignore=["MN4"]) == []
    assert [d.code for d in lint_source(SCRIPT, "train.py", select=["MN401"])] == ["MN401"] * 2
    with pytest.raises(SelectorError):
        lint_source(SCRIPT, "train.py", select=["XY1"])


@pytest.mark.parametrize(
    ("source", "line", "col"),
    [('print "hello"\n', 1, 1), ("x = 1\ny = 2\ndef f(:\n    pass\n", 3, 7)],
)
def test_unparsable_source_raises_with_position(source: str, line: int, col: int) -> None:
    with pytest.raises(LintSyntaxError) as info:
        lint_source(source, "old.py")
    assert (info.value.path, info.value.line, info.value.col) == ("old.py", line, col)
    assert info.value.reason


def test_lint_wrapper_reuses_metadata_the_caller_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = lint_source(SCRIPT, "train.py")
    wrapper = MetadataWrapper(cst.parse_module(SCRIPT))
    wrapper.resolve_many([QualifiedNameProvider, PositionProvider])

    def visit_Module(*args: object, **kwargs: object) -> None:  # named so libcst batches it
        raise AssertionError("scope analysis ran again")

    monkeypatch.setattr(ScopeProvider, "visit_Module", visit_Module)
    assert lint_wrapper(wrapper, "train.py") == expected
    with pytest.raises(AssertionError, match="scope analysis ran again"):
        lint_source(SCRIPT, "train.py")  # proves the patch bites on a fresh resolution


def test_clean_and_non_training_files_have_no_findings() -> None:
    assert lint_source("import os\nos.system('ls')\n", "tool.py") == []
    assert lint_source("", "empty.py") == []


def test_diagnostic_fields_in_contract_order_and_sorting() -> None:
    fields = list(Diagnostic.__dataclass_fields__)
    assert fields == ["code", "message", "path", "line", "col", "end_line", "end_col", "fixable"]
    late = Diagnostic("MN101", "m", "a.py", 2, 1, 2, 5, False)
    early = Diagnostic("MN999", "m", "a.py", 1, 9, 1, 12, True)
    other = Diagnostic("MN100", "m", "b.py", 1, 1, 1, 2, False)
    assert sorted([other, late, early]) == [early, late, other]


@pytest.mark.parametrize(
    ("imports", "training"),
    [
        ("import chainer", True),
        ("from chainer.training import extensions", True),
        ("import chainermn.links", True),
        ("from mnify import runtime as mn", True),
        ("import mnify.runtime.links", True),
        ("from mpi4py import MPI", True),
        ("import cupy as cp", True),
        ("from mnify.cli import main", False),
        ("import chainerx_like", False),
        ("from . import chainer", False),
    ],
)
def test_which_files_are_training_scripts(imports: str, training: bool) -> None:
    found = lint_source(f"{imports}\nimport os\nos.system('ls')\n", "t.py")
    assert bool(found) == training
