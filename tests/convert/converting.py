"""The one way the converter tests convert a single source text and insist that it converted.

Tests write their scripts indented inside triple-quoted strings, so the source is dedented
first; a conversion that fails or skips the file fails the test here, with the converter's
error, instead of later on a ``None`` output.
"""

from __future__ import annotations

import textwrap
from typing import Any

from mnify.converter import ConvertOptions, convert_source
from mnify.converter.driver import FileResult


def convert(
    source: str, path: str = "train.py", *, idempotent: bool = False, **options: Any
) -> FileResult:
    """Convert ``source`` on its own as ``path`` with ``ConvertOptions(**options)``.

    ``idempotent=True`` also converts the output again, with the already-distributed detection
    off so that the rewrites themselves are checked, and asserts that nothing changes.
    """
    result = convert_source(textwrap.dedent(source), path, ConvertOptions(**options))
    assert result.error is None, result.error
    assert result.output is not None, f"{path} was not converted"
    if idempotent:
        again = convert_source(
            result.output, path, ConvertOptions(**options, leave_distributed=False)
        )
        assert again.output == result.output, f"not idempotent:\n{again.diff()}"
    return result
