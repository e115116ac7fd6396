"""Issue 31, item 7 (a), as ``mnify lint`` sees it: MN503 fires on what builds an optimizer
(a class of the project deriving from Chainer's), and never on a class of the script's that only
shares a name with one of Chainer's optimizers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mnify.lint import lint_source
from mnify.lint.diagnostic import Diagnostic
from mnify.lint.files import lint_paths

OPTIM = """\
import chainer


class Adam(chainer.optimizers.Adam):
    pass
"""

SCRIPT = """\
import chainer
from chainer.optimizers import SGD
from mnify import runtime as mn
from optim import Adam


class SGD(object):
    def __init__(self, lr):
        self.lr = lr


comm = mn.create_communicator('flat')
opt = Adam(alpha=0.001)
tried = SGD(0.1)
plain = chainer.optimizers.MomentumSGD()
"""


def _lines(diagnostics: Sequence[Diagnostic], source: str) -> list[str]:
    lines = source.splitlines()
    return sorted(lines[d.line - 1] for d in diagnostics if d.code == "MN503")


def test_lint_resolves_what_a_call_builds(tmp_path: Path) -> None:
    (tmp_path / "optim.py").write_text(OPTIM)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = lint_paths([script], select=["MN503"])
    assert result.errors == []
    assert _lines(result.diagnostics, SCRIPT) == [
        "opt = Adam(alpha=0.001)",
        "plain = chainer.optimizers.MomentumSGD()",
    ]


def test_a_text_linted_on_its_own_goes_by_names() -> None:
    """Without the program (``lint_source`` of a text), the qualified names decide: the
    project's Adam is not known to be one, Chainer's MomentumSGD is."""
    found = lint_source(SCRIPT, "<text>", select=["MN503"])
    assert "plain = chainer.optimizers.MomentumSGD()" in _lines(found, SCRIPT)
    assert "opt = Adam(alpha=0.001)" not in _lines(found, SCRIPT)
