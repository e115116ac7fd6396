"""The converter's steps behind ``mnify convert``: libcst rewrites, one module per docs/design.md
§1 step, planned by the pipeline of mnify/converter/ against the facts of mnify/program/.

Each rewrite plans its edits (``communicator``, ``device``, ``dataset``, ``evaluator``,
``guards``, ``scaling``, ``model_parallel``, ``imports``; the optimizer, batch-norm, log-file and
fork-hazard fixes live in their hazard's module under mnify/hazards/ and register through
``registry`` like the others), ``comm`` is threaded through helpers and model classes across
files (``context``, ``call_sites``), all edits are applied in one pass (``edits``), the output is
checked (``verify``) and reported (``report``; line numbers from ``lines`` and ``input_lines``,
flags in ``options``).

The names below are resolved on first use (``mnify._lazy``): a hazard module imports rewrite
helpers (``mnify.rewrites.context``), so importing a submodule must not import the others.
"""

from __future__ import annotations

from mnify._lazy import lazy_exports

# public name -> module (relative to this package) that defines it
_NAMES: dict[str, str] = {
    "ConvertOptions": "options",
    "FileResult": "result",
    "Report": "report",
    "ReportEntry": "report",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _NAMES)
