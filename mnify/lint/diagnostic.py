"""What a rule reports: one finding at one source range, in a form every formatter shares."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnostic:
    """One finding. Lines and columns are 1-based; ``end_col`` is exclusive (as in ruff's JSON).

    Diagnostics sort by ``path, line, col`` (then code and message), the order every output
    format prints in. ``fixable`` says whether ``mnify convert`` removes the hazard.
    """

    code: str
    message: str
    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    fixable: bool

    def sort_key(self) -> tuple[str, int, int, str, str]:
        return (self.path, self.line, self.col, self.code, self.message)

    def __lt__(self, other: Diagnostic) -> bool:
        return self.sort_key() < other.sort_key()


class LintSyntaxError(Exception):
    """A file that libcst cannot parse; carries the 1-based position of the failure."""

    def __init__(self, path: str, line: int, col: int, reason: str) -> None:
        super().__init__(f"{path}: {line}:{col}: {reason}")
        self.path = path
        self.line = line
        self.col = col
        self.reason = reason
