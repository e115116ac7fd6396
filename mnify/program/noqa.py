"""Suppression comments: ``# noqa`` / ``# noqa: MN101, MN3`` on a line, ``# mnify: noqa`` (or
``# mnify: noqa: MN101``) anywhere for the whole file. Codes may be prefixes. Comments are found
with ``tokenize``, so a ``# noqa`` inside a string literal does not count."""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

_LINE = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*))?", re.I)
_FILE = re.compile(
    r"#\s*mnify:\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*))?", re.I
)
ALL_CODES = None  # a bare noqa: every code


def _codes(text: str | None) -> frozenset[str] | None:
    if not text:
        return ALL_CODES
    return frozenset(part.upper() for part in re.split(r"[\s,]+", text) if part)


def _covers(codes: frozenset[str] | None, code: str) -> bool:
    return codes is None or any(code.startswith(c) for c in codes)


@dataclass
class Suppressions:
    """The suppression comments of one file."""

    file_codes: list[frozenset[str] | None] = field(default_factory=list)
    line_codes: dict[int, frozenset[str] | None] = field(default_factory=dict)

    @property
    def whole_file(self) -> bool:
        return any(codes is None for codes in self.file_codes)

    def suppresses(self, line: int, code: str) -> bool:
        if any(_covers(codes, code) for codes in self.file_codes):
            return True
        return line in self.line_codes and _covers(self.line_codes[line], code)


def _comments(source: str) -> list[tuple[int, str]]:
    try:
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        return [(tok.start[0], tok.string) for tok in tokens if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        found = []
        for number, text in enumerate(source.splitlines(), start=1):
            if "#" in text:
                found.append((number, text[text.index("#") :]))
        return found


def parse_suppressions(source: str) -> Suppressions:
    result = Suppressions()
    if "noqa" not in source and "NOQA" not in source:
        return result
    for line, comment in _comments(source):
        file_match = _FILE.search(comment)
        if file_match:
            result.file_codes.append(_codes(file_match.group("codes")))
            continue
        line_match = _LINE.search(comment)
        if line_match:
            result.line_codes[line] = _codes(line_match.group("codes"))
    return result
