"""What converting one file gives back: its new text or why there is none, and its report."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from mnify.rewrites.report import ReportEntry


@dataclass
class FileResult:
    """One file's conversion: the new text (None on error/skip) and its report entries."""

    path: str
    source: str
    output: str | None = None
    error: str | None = None
    skipped: str | None = None
    entries: list[ReportEntry] = field(default_factory=list)
    # what lint found in the input read as a distributed program (fixable rules)
    found: list[ReportEntry] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.output is not None and self.output != self.source

    def diff(self) -> str:
        if not self.changed:
            return ""
        assert self.output is not None
        return "".join(
            difflib.unified_diff(
                self.source.splitlines(keepends=True),
                self.output.splitlines(keepends=True),
                fromfile=f"a/{self.path}",
                tofile=f"b/{self.path}",
            )
        )
