"""No rule crashes on real code: the converter's fixtures (inputs and outputs), this package's
communicators and the lint fixtures all lint without an internal error."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnify.lint.files import lint_paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_no_internal_errors_on_real_code() -> None:
    targets = [ROOT / "fixtures", ROOT / "mnify" / "runtime" / "communicators"]
    result = lint_paths([t for t in targets if t.exists()], select=["ALL"])
    assert result.files > 30
    assert [e for e in result.errors if "internal error" in e] == []
