"""Where an output line came from: the report names lines of the file the user wrote.

Lint of the converted output finds hazards at output lines; the report must point at the input
the user knows. ``difflib`` matches the unchanged lines of both; a line the converter added is
reported at the nearest unchanged line above it.
"""

from __future__ import annotations

import difflib


def input_line(source: str, output: str | None, output_line: int) -> int:
    """The input line ``output_line`` of ``output`` came from (the nearest unchanged line above
    it); the line itself when nothing changed."""
    if output is None or output == source:
        return output_line
    matcher = difflib.SequenceMatcher(
        None, source.splitlines(), output.splitlines(), autojunk=False
    )
    best = 1
    for a, b, size in matcher.get_matching_blocks():
        if b <= output_line - 1 < b + size:
            return a + (output_line - 1 - b) + 1
        if b + size <= output_line - 1:
            best = a + size
    return best
