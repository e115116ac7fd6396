"""The converter behind ``mnify convert``: libcst rewrites, one module per docs/design.md §1 step.

Pipeline (``driver``): parse each file, resolve qualified names once (``facts``, read through
``source_file``), let every rewrite plan its edits against those facts (``communicator``,
``device``, ``dataset``, ``evaluator``, ``guards``, ``scaling``, ``model_parallel``, ``imports``;
the optimizer, batch-norm, log-file and fork-hazard fixes live in their hazard's module under
mnify/hazards/ and register through ``registry`` like the others), thread ``comm`` through
helpers and model classes across files (``context``, ``call_sites``), apply all edits in one pass
(``edits``), check the output (``verify``, ``reconcile``), and report (``report``; line numbers
from ``lines`` and ``input_lines``, flags in ``options``).

The names below are resolved on first use (``mnify._lazy``): a hazard module imports rewrite
helpers (``mnify.rewrites.context``) while the driver imports lint, which imports every hazard,
so importing a submodule must not import the driver.
"""

from __future__ import annotations

from mnify._lazy import lazy_exports

# public name -> module (relative to this package) that defines it
_NAMES: dict[str, str] = {
    "ConvertOptions": "options",
    "FileResult": "driver",
    "Report": "report",
    "ReportEntry": "report",
    "convert_source": "driver",
    "convert_sources": "driver",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES)
