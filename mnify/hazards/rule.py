"""The rule base class: one hazard, its stable code, its documentation and its detection logic.

A rule declares visitor methods named like libcst's (``visit_Call``, ``leave_If`` ...); they ride
the program's one walk of the file (mnify/program/walk.py), after ``LintContext`` has seen the
node. Findings
are collected with ``report`` and become diagnostics only if the script turns out to be the kind
the rule ``applies_to`` (a rule cannot know a file is distributed before the walk ends), after
``finish`` has run for rules that decide at the end of the file.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from mnify.program.context import LintContext


class AppliesTo(enum.Enum):
    """Which scripts a rule checks."""

    TRAINING = (
        "training scripts (files importing chainer, chainermn, mnify.runtime, cupy or mpi4py)"
    )
    DISTRIBUTED = "distributed scripts (files that create a communicator)"
    DATA_PARALLEL = "data-parallel scripts (distributed, no model-parallel links or iterators)"


@dataclass(frozen=True)
class Finding:
    """A report before positions are known; ``{line}`` in the message is replaced by the
    line of ``related`` (for "the ``if`` at line N" style messages)."""

    node: cst.CSTNode
    message: str
    related: cst.CSTNode | None = None


class Rule:
    """Base class: subclasses set the class attributes and write visitor methods.

    The class docstring states the precise firing condition; ``explain`` and docs/rules.md show it.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]  # the default message: what is wrong, in one line
    why: ClassVar[str]  # what breaks, and how it shows at run time
    bad: ClassVar[str]  # a script fragment the rule fires on
    good: ClassVar[str]  # the corrected fragment; the rule must not fire on it
    fixable: ClassVar[bool] = False  # `mnify convert` rewrites this hazard away
    default_enabled: ClassVar[bool] = True  # False: information/preview, selected explicitly
    applies_to: ClassVar[AppliesTo] = AppliesTo.TRAINING

    def __init__(self, ctx: LintContext) -> None:
        self.ctx = ctx
        self.findings: list[Finding] = []

    def report(
        self, node: cst.CSTNode, message: str | None = None, related: cst.CSTNode | None = None
    ) -> None:
        self.findings.append(Finding(node, message or self.summary, related))

    def applies(self) -> bool:
        ctx = self.ctx
        if not ctx.is_training_script:
            return False
        if self.applies_to is AppliesTo.DISTRIBUTED:
            return ctx.is_distributed
        if self.applies_to is AppliesTo.DATA_PARALLEL:
            return ctx.is_data_parallel
        return True

    def finish(self) -> None:
        """Called once after the walk, only when ``applies()``; override to decide late."""

    def answered_elsewhere(self, finding: Finding, function: str | None) -> bool:
        """Whether another part of the program answers ``finding`` (``self.ctx.project``, see
        mnify/program/project.py); ``function`` names the innermost function around it. The
        runner drops such findings: a rule judges the whole program, not only its file."""
        return False

    @classmethod
    def condition(cls) -> str:
        """The precise firing condition (the class docstring, dedented)."""
        return inspect.cleandoc(cls.__doc__ or "")
