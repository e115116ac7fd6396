"""The conversion report: what changed per file and, listed first, what needs a person.

Modelled on tf_upgrade_v2's report: every rewrite that recognises a pattern either converts it
(a ``changed`` entry) or leaves it alone and says why (a ``needs-person`` entry). Nothing is
skipped silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import libcst as cst

Severity = Literal["needs-person", "changed", "info"]

_ORDER: dict[str, int] = {"needs-person": 0, "changed": 1, "info": 2}


@dataclass(frozen=True)
class ReportEntry:
    """One finding: ``path:line: [step] message``."""

    path: str
    line: int
    step: str
    severity: Severity
    message: str
    code: str = ""
    # machine-readable facts behind the message, for the CLI's closing lines:
    # ("per_rank_batch", expr), ("global_batch", expr), ("iteration_schedule", what)
    facts: tuple[tuple[str, str], ...] = ()

    def fact(self, name: str) -> str | None:
        return next((value for key, value in self.facts if key == name), None)

    def render(self) -> str:
        code = f" {self.code}" if self.code else ""
        return f"{self.path}:{self.line}:{code} [{self.step}] {self.message}"


# What a report entry says the output shows: ("guarded", statement) — it runs under
# ``if comm.rank == 0:``; ("scattered", name) — the dataset reaches scatter_dataset;
# ("rank0-loads", name) — rank 0 binds it, the others bind None.
Claim = tuple[Literal["guarded", "scattered", "rank0-loads"], "cst.CSTNode | str"]


@dataclass(eq=False)
class FileReport:
    """One file's report while it is converted, apart from its edit plan: the entries, what
    lint found in the input (``found``, the by-rule count) and the ``claims`` some entries make
    about the output, which the driver checks before the output is handed out."""

    entries: list[ReportEntry] = field(default_factory=list)
    found: list[ReportEntry] = field(default_factory=list)
    claims: list[tuple[ReportEntry, Claim]] = field(default_factory=list)

    def add(self, entry: ReportEntry, claim: Claim | None = None) -> None:
        self.entries.append(entry)
        if claim is not None:
            self.claims.append((entry, claim))

    def drop(self, unwanted: Callable[[ReportEntry], bool]) -> None:
        """Remove the entries ``unwanted`` picks (their claims stay: the plan still holds)."""
        self.entries = [e for e in self.entries if not unwanted(e)]

    def keep_only_needs_person(self) -> None:
        """What a file whose planned edits were all forgotten still reports."""
        self.drop(lambda e: e.severity != "needs-person")

    def withdraw_claims_on(self, subject: object) -> None:
        """Take back the entries claiming something of ``subject``, and their claims."""
        dropped = {id(entry) for entry, (_kind, about) in self.claims if about is subject}
        self.claims = [(e, c) for e, c in self.claims if id(e) not in dropped]
        self.entries = [e for e in self.entries if id(e) not in dropped]


@dataclass
class FileOutcome:
    """The result for one file: changed or not, or why it could not be converted."""

    path: str
    changed: bool = False
    error: str | None = None
    skipped: str | None = None


@dataclass
class Report:
    """Entries and outcomes for a whole conversion run."""

    entries: list[ReportEntry] = field(default_factory=list)
    files: list[FileOutcome] = field(default_factory=list)
    # what lint found in the inputs, read as the distributed program they become
    found: list[ReportEntry] = field(default_factory=list)

    def add(self, entry: ReportEntry) -> None:
        self.entries.append(entry)

    def extend(self, entries: list[ReportEntry]) -> None:
        self.entries.extend(entries)

    def sorted_entries(self) -> list[ReportEntry]:
        return sorted(self.entries, key=lambda e: (_ORDER[e.severity], e.path, e.line, e.step))

    def needs_person(self) -> list[ReportEntry]:
        return [e for e in self.entries if e.severity == "needs-person"]

    def summary(self) -> str:
        changed = sum(1 for f in self.files if f.changed)
        errors = sum(1 for f in self.files if f.error)
        skipped = sum(1 for f in self.files if f.skipped)
        unchanged = len(self.files) - changed - errors - skipped
        parts = [f"{changed} changed", f"{unchanged} unchanged"]
        if skipped:
            parts.append(f"{skipped} skipped (# mnify: noqa, or already distributed)")
        if errors:
            parts.append(f"{errors} failed")
        people = len(self.needs_person())
        text = f"mnify convert: {len(self.files)} file(s): " + ", ".join(parts)
        if people:
            text += f"; {people} item(s) need a person"
        return text

    def by_rule(self) -> list[tuple[str, int, int, int]]:
        """``(code, found in the input, changed, needing a person)`` per rule code, sorted:
        lint finds, convert fixes, and one code names both."""
        codes = {e.code for e in (*self.found, *self.entries) if e.code}
        rows = []
        for code in sorted(codes):
            found = sum(1 for e in self.found if e.code == code)
            changed = sum(1 for e in self.entries if e.code == code and e.severity == "changed")
            people = sum(1 for e in self.entries if e.code == code and e.severity == "needs-person")
            rows.append((code, found, changed, people))
        return rows

    def render_text(self) -> str:
        """Plain text: the needs-a-person section first, then changes, then notes."""
        lines = ["# mnify conversion report", ""]
        titles = {
            "needs-person": "## Needs a person",
            "changed": "## Changed",
            "info": "## Notes",
        }
        entries = self.sorted_entries()
        for severity in ("needs-person", "changed", "info"):
            group = [e for e in entries if e.severity == severity]
            lines.append(titles[severity])
            lines.extend(f"- {e.render()}" for e in group)
            if not group:
                lines.append("- (none)")
            lines.append("")
        lines.append("## By rule")
        lines.append("| code | found | changed | needs a person |")
        lines.append("|---|---|---|---|")
        lines.extend(f"| {c} | {f} | {ch} | {p} |" for c, f, ch, p in self.by_rule())
        lines.append("")
        lines.append("## Files")
        for f in self.files:
            state = (
                f"error: {f.error}"
                if f.error
                else f"skipped: {f.skipped}"
                if f.skipped
                else "changed"
                if f.changed
                else "unchanged"
            )
            lines.append(f"- {f.path}: {state}")
        lines.append("")
        lines.append(self.summary())
        return "\n".join(lines) + "\n"

    def render_json(self) -> str:
        return json.dumps(
            {
                "entries": [asdict(e) for e in self.sorted_entries()],
                "files": [asdict(f) for f in self.files],
                "by_rule": [
                    {"code": c, "found": f, "changed": ch, "needs_person": p}
                    for c, f, ch, p in self.by_rule()
                ],
                "summary": self.summary(),
            },
            indent=2,
        )
