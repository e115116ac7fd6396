"""``mnify convert`` and ``mnify lint --fix`` as a pipeline over the program (``driver``): parse,
analyse, detect, plan every step (``steps``: the rewrites of mnify/rewrites/ and the fixes the
hazards of mnify/hazards/ own), apply, verify, write; lint on what it reads and writes
(``reconcile``); the generated step documentation (``docs``, docs/converter.md).

It sits above the hazards and the rewrites, which are below it and never import it
(docs/design.md §1).
"""

from __future__ import annotations

from mnify.converter.driver import convert_source, convert_sources
from mnify.rewrites.options import ConvertOptions
from mnify.rewrites.report import Report, ReportEntry
from mnify.rewrites.result import FileResult

__all__ = [
    "ConvertOptions",
    "FileResult",
    "Report",
    "ReportEntry",
    "convert_source",
    "convert_sources",
]
