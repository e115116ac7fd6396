"""``mnify lint --fix``: the converter's rewrites, applied to a distributed script for the lint
rules chosen, in the script's own runtime spelling (``chainermn.X`` or ``mn.X``).

Nothing else of a conversion runs: no communicator is created (the script has one), files that
are already distributed are rewritten all the same, and only the steps that fix a selected rule
plan edits. The output passes the same checks as a conversion's before anyone writes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mnify.converter.driver import FileResult, convert_source
from mnify.converter.steps import fixable_codes
from mnify.rewrites.options import ConvertOptions

_CHAINERMN = re.compile(r"^\s*(import|from)\s+chainermn\b", re.M)


def fix_source(source: str, path: str, codes: Iterable[str]) -> FileResult:
    """Fix the findings of the lint rules ``codes`` (those with a fix) in one file."""
    wanted = frozenset(codes) & fixable_codes()
    options = ConvertOptions(
        target="chainermn" if _CHAINERMN.search(source) else "mnify",
        leave_distributed=False,
        only_codes=wanted,
    )
    return convert_source(source, path, options)
