"""The package's docstrings and comments cite only documents that are in the repository.

A citation of a design document kept elsewhere (``DESIGN.md``, ``../shared``), or of the seeds
the project started from, points the next reader at nothing: the repository's own copy is
docs/design.md, cited as ``docs/design.md §N``. Every ``*.md`` named in ``mnify/`` must exist
(at the repository's root or in ``docs/``), and every cited section of docs/design.md must be
one of its numbered sections.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mnify"

# Where documents outside the repository were cited from; none may appear in the package.
OUTSIDE = re.compile(r"(?-i:DESIGN\.md)|\.\./shared|\bshared/|\bseeds?/|\bseeds?\s+\d{3}\b", re.I)
MARKDOWN = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.md)\b")
DESIGN_SECTION = re.compile(r"docs/design\.md \(?§(\d+)")
URL = re.compile(r"https?://\S+")


def _package_texts() -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(REPO)), path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _lines(text: str) -> list[tuple[int, str]]:
    return [(number, URL.sub("", line)) for number, line in enumerate(text.splitlines(), 1)]


def test_no_citation_of_a_document_outside_the_repository() -> None:
    found = [
        f"{name}:{number}: {line.strip()}"
        for name, text in _package_texts()
        for number, line in _lines(text)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_every_cited_markdown_file_exists() -> None:
    missing = [
        f"{name}:{number}: {cited}"
        for name, text in _package_texts()
        for number, line in _lines(text)
        for cited in MARKDOWN.findall(line)
        if not (REPO / cited).is_file() and not (REPO / "docs" / cited).is_file()
    ]
    assert missing == []


def test_every_cited_design_section_exists() -> None:
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\.", design, re.M))
    assert sections, "docs/design.md has no numbered sections"
    unknown = [
        f"{name}:{number}: §{section}"
        for name, text in _package_texts()
        for number, line in _lines(text)
        for section in DESIGN_SECTION.findall(line)
        if section not in sections
    ]
    assert unknown == []


def test_the_scan_sees_what_it_forbids() -> None:
    """The patterns catch the citations this test exists for (and pass the good ones)."""
    assert OUTSIDE.search("see ../shared/DESIGN.md") and OUTSIDE.search("Seed 000 (nnabla)")
    assert OUTSIDE.search("seeds/002/train.py") and not OUTSIDE.search("docs/design.md §3")
    assert not OUTSIDE.search("same batches, same random draws (seed every rank alike)")
    assert MARKDOWN.findall("docs/design.md §1 and rules.md#mn101") == [
        "docs/design.md",
        "rules.md",
    ]
    assert DESIGN_SECTION.findall("schema in docs/design.md (§2)") == ["2"]
