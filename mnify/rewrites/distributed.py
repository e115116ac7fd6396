"""docs/design.md §1, step "already distributed": a ChainerMN script, or mnify's own output,
is left as it is.

Converting such a file again would put guards before its communicator exists, wrap its
evaluator twice, or scatter inside its own ``if comm.rank == 0:`` blocks. A file is already
distributed when it imports ChainerMN or mnify's runtime, or creates a communicator.
"""

from __future__ import annotations

from mnify import vocabulary as vocab
from mnify.rewrites.context import FileContext

_RUNTIMES = ("chainermn", "mnify.runtime")


def _runtime_of(qualified: str) -> str | None:
    bare = qualified.lstrip(".")
    for runtime in _RUNTIMES:
        if bare == runtime or bare.startswith(runtime + "."):
            return runtime
    return None


def reason(ctx: FileContext) -> str | None:
    """Why this file is already distributed (for the report), or None."""
    for module in ctx.facts.imported_modules.values():
        runtime = _runtime_of(module)
        if runtime is not None:
            return f"it imports {runtime}"
    for call in ctx.facts.calls:
        if vocab.is_communicator_factory(call.qname):
            return "it creates a communicator"
        runtime = _runtime_of(call.qname)
        if runtime is not None:
            return f"it uses {runtime}"
    return None
