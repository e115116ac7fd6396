"""The one way the converter tests convert a single source text and insist that it converted.

Tests write their scripts indented inside triple-quoted strings, so the source is dedented
first; a conversion that fails or skips the file fails the test here, with the converter's
error, instead of later on a ``None`` output.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mnify.converter import ConvertOptions, convert_source, convert_sources
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


def convert_tree(files: dict[str, str]) -> dict[str, FileResult]:
    """Convert several files together (one project), each by its path; none may fail."""
    results = convert_sources(files, ConvertOptions())
    for r in results:
        assert r.error is None, r.error
    return {r.path: r for r in results}


def main_body(text: str | None, function: str = "main") -> list[str]:
    """The statements of ``function`` in ``text``, unparsed: what assertions compare."""
    tree = ast.parse(text or "")
    found = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == function)
    return [ast.unparse(s) for s in found.body]


def install_package(site: Path, files: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Write an installed package's modules (indented texts) under ``site``, put it on
    ``sys.path`` and give the effect cache a directory of its own beside it."""
    for name, text in files.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("XDG_CACHE_HOME", str(site.parent / "cache"))
    return site
