"""Reading lint fixtures: ``fixtures/lint/MN123*.py`` with ``# error: MN123`` / ``# ok`` markers."""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lint"
_ERROR = re.compile(r"#\s*error:\s*(?P<codes>MN[0-9]+(?:\s*,\s*MN[0-9]+)*)")
_OK = re.compile(r"#\s*ok\b")


@dataclass(frozen=True)
class Fixture:
    path: Path
    code: str  # the rule the file is about (its name starts with the code)
    errors: frozenset[int]  # lines where the rule must fire
    oks: frozenset[int]  # near misses: lines where it must not


def load(path: Path) -> Fixture:
    code = path.name[:5]
    errors, oks = set(), set()
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        match = _ERROR.search(token.string)
        if match:
            codes = {c.strip() for c in match.group("codes").split(",")}
            if code in codes:
                errors.add(line)
        elif _OK.search(token.string):
            oks.add(line)
    return Fixture(path, code, frozenset(errors), frozenset(oks))


def all_fixtures() -> list[Fixture]:
    return [load(path) for path in sorted(FIXTURES.glob("MN*.py"))]
