"""Output formats for ``mnify lint`` (ruff's names): concise, json, github, sarif; plus the
``--statistics`` table. Every format prints the same 1-based line/column from ``Diagnostic``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mnify import __version__
from mnify.lint.diagnostic import Diagnostic
from mnify.lint.registry import ALL_RULES, RULES_BY_CODE

FORMATS = ("concise", "json", "github", "sarif")
_SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_INFORMATION_URI = "https://github.com/mnify/mnify/blob/main/docs/rules.md"


def format_concise(diagnostics: Sequence[Diagnostic], unlinted: int = 0) -> str:
    """One line per finding, then a summary; ``unlinted`` files (unreadable, unparsable) make
    it a failure line, never "All checks passed!"."""
    lines = [f"{d.path}:{d.line}:{d.col}: {d.code} {d.message}" for d in diagnostics]
    fixable = sum(d.fixable for d in diagnostics)
    failed = f"{unlinted} file{'' if unlinted == 1 else 's'} could not be linted"
    if diagnostics:
        noun = "finding" if len(diagnostics) == 1 else "findings"
        summary = f"Found {len(diagnostics)} {noun}"
        if fixable:
            summary += f" ({fixable} fixable with `mnify lint --fix`)"
        lines.append(summary + (f"; {failed}." if unlinted else "."))
    elif unlinted:
        lines.append(f"Failed: {failed}; no findings in the rest.")
    else:
        lines.append("All checks passed!")
    return "\n".join(lines) + "\n"


def _as_json(d: Diagnostic) -> dict[str, Any]:
    return {
        "code": d.code,
        "message": d.message,
        "path": d.path,
        "line": d.line,
        "column": d.col,
        "end_line": d.end_line,
        "end_column": d.end_col,
        "fixable": d.fixable,
    }


def format_json(diagnostics: Sequence[Diagnostic]) -> str:
    return json.dumps([_as_json(d) for d in diagnostics], indent=2) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def format_github(diagnostics: Sequence[Diagnostic]) -> str:
    """GitHub Actions workflow commands: one ``::error`` annotation per finding."""
    lines = []
    for d in diagnostics:
        properties = (
            f"file={_escape_property(d.path)},line={d.line},col={d.col},"
            f"endLine={d.end_line},endColumn={d.end_col},"
            f"title={_escape_property(f'mnify ({d.code})')}"
        )
        text = _escape_data(f"{d.path}:{d.line}:{d.col}: {d.code} {d.message}")
        lines.append(f"::error {properties}::{text}")
    return "".join(line + "\n" for line in lines)


def sarif_document(diagnostics: Sequence[Diagnostic]) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one run; every rule is described, results point at their rule."""
    index = {rule.code: position for position, rule in enumerate(ALL_RULES)}
    rules = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.condition()},
            "help": {"text": rule.why},
            "helpUri": f"{_INFORMATION_URI}#{rule.code.lower()}",
            "defaultConfiguration": {
                "enabled": rule.default_enabled,
                "level": "error" if rule.default_enabled else "note",
            },
            "properties": {"fixable": rule.fixable},
        }
        for rule in ALL_RULES
    ]
    results = [
        {
            "ruleId": d.code,
            "ruleIndex": index[d.code],
            "level": "error" if RULES_BY_CODE[d.code].default_enabled else "note",
            "message": {"text": d.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": Path(d.path).as_posix()},
                        "region": {
                            "startLine": d.line,
                            "startColumn": d.col,
                            "endLine": d.end_line,
                            "endColumn": d.end_col,
                        },
                    }
                }
            ],
            "properties": {"fixable": d.fixable},
        }
        for d in diagnostics
    ]
    return {
        "$schema": _SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "mnify",
                        "version": __version__,
                        "informationUri": _INFORMATION_URI,
                        "rules": rules,
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }


def format_sarif(diagnostics: Sequence[Diagnostic]) -> str:
    return json.dumps(sarif_document(diagnostics), indent=2) + "\n"


def format_diagnostics(
    diagnostics: Sequence[Diagnostic], output_format: str, unlinted: int = 0
) -> str:
    """``unlinted``: files that could not be linted (their errors go to stderr)."""
    if output_format == "concise":
        return format_concise(diagnostics, unlinted)
    formatter = {
        "json": format_json,
        "github": format_github,
        "sarif": format_sarif,
    }[output_format]
    return formatter(diagnostics)


def format_statistics(diagnostics: Sequence[Diagnostic], output_format: str = "concise") -> str:
    """Count per code, most frequent first (ruff's ``--statistics``); JSON when asked for."""
    counts = Counter(d.code for d in diagnostics)
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if output_format == "json":
        rows = [
            {
                "code": code,
                "name": RULES_BY_CODE[code].name,
                "count": count,
                "fixable": RULES_BY_CODE[code].fixable,
            }
            for code, count in ordered
        ]
        return json.dumps(rows, indent=2) + "\n"
    lines = []
    for code, count in ordered:
        rule = RULES_BY_CODE[code]
        mark = "[*]" if rule.fixable else "   "
        lines.append(f"{count:>5}\t{code}\t{mark} {rule.name}")
    return "".join(line + "\n" for line in lines)
