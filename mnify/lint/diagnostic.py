"""What a rule reports: one finding at one source range, in a form every formatter shares."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding. Lines and columns are 1-based; ``end_col`` is exclusive (as in ruff's JSON).

    Field order makes the natural sort order ``path, line, col`` (then code), which is the order
    every output format prints in. ``fixable`` says whether ``mnify convert`` removes the hazard.
    """

    path: str
    line: int
    col: int
    code: str
    message: str
    end_line: int
    end_col: int
    fixable: bool


class LintSyntaxError(Exception):
    """A file that libcst cannot parse; carries the 1-based position of the failure."""

    def __init__(self, path: str, line: int, col: int, reason: str) -> None:
        super().__init__(f"{path}: {line}:{col}: {reason}")
        self.path = path
        self.line = line
        self.col = col
        self.reason = reason
