"""The converter behind ``mnify convert``: libcst rewrites, one module per docs/design.md §1 step.

Pipeline (``driver``): parse each file, resolve qualified names once (``facts``), let every
rewrite plan its edits against those facts (``communicator``, ``device``, ``optimizer``,
``dataset``, ``evaluator``, ``guards``, ``batchnorm``, ``forkserver``, ``scaling``,
``model_parallel``, ``imports``), thread ``comm`` through helpers and model classes across files
(``context``), apply all edits in one pass (``edits``), re-parse the output, and report
(``report``; line numbers from ``lines``, names matched by ``chainer_names``, flags in
``options``).
"""

from __future__ import annotations

from mnify.rewrites.driver import FileResult, convert_source, convert_sources
from mnify.rewrites.options import ConvertOptions
from mnify.rewrites.report import Report, ReportEntry

__all__ = [
    "ConvertOptions",
    "FileResult",
    "Report",
    "ReportEntry",
    "convert_source",
    "convert_sources",
]
