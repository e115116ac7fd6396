"""docs/design.md §1, step "fork hazards": forking an MPI process can corrupt or crash it.

``MultiprocessIterator`` forks worker processes, so the forkserver preamble
(``multiprocessing.set_start_method('forkserver')`` and one dummy process started and joined)
goes in before the communicator is created: later workers are forked from the clean server,
never from the MPI process. Other fork hazards (``subprocess``, ``os.system``, ``os.fork``,
``multiprocessing``, ``DumpGraph``) have no safe rewrite: ``mnify lint``'s MN2xx rules find them
in the converted output and the report lists them for a person.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import statement
from mnify.rewrites.registry import rewrite


@rewrite("fork-hazard", order=90, fixes=("MN202",), code="MN808")
def plan(ctx: FileContext) -> None:
    """Reports hazards; sets ``ctx.preamble``, what goes before the communicator (maybe none)."""
    ctx.preamble = _plan(ctx)


def _plan(ctx: FileContext) -> list[cst.BaseStatement]:
    facts = ctx.facts
    has_preamble = any(c.qname == "multiprocessing.set_start_method" for c in facts.calls)
    mp_calls = [c for c in facts.calls if vocab.is_multiprocess_iterator(c.qname)]
    entry = ctx.entry
    if not mp_calls or has_preamble or entry is None:
        return []
    if entry.exists and entry.creation is None:
        return []
    if ctx.suppressed(mp_calls[0].node, "fork-hazard"):
        return []
    if entry.func is None and not facts.has_main_guard:
        ctx.note(
            mp_calls[0].node,
            "fork-hazard",
            "needs-person",
            "MultiprocessIterator in a script without `if __name__ == '__main__':` -- the "
            "forkserver re-imports the script: move the training code under a main guard",
        )
    mp = facts.local_name_of("multiprocessing")
    if mp is None:
        ctx.imports_needed.add("import multiprocessing")
        mp = "multiprocessing"
    ctx.note(
        mp_calls[0].node,
        "fork-hazard",
        "changed",
        "MultiprocessIterator forks workers: forkserver preamble inserted before the communicator",
    )
    preamble = [
        statement(
            "# MultiprocessIterator forks: start workers from a forkserver, never from MPI\n"
            f"{mp}.set_start_method({ctx.q('forkserver')})\n"
        ),
        statement(f"p = {mp}.Process()\n"),
        statement("p.start()\n"),
        statement("p.join()\n"),
    ]
    if entry.creation is not None:  # the script creates its communicator already
        ctx.plan.insert_before(entry.creation, preamble)
        return []
    return preamble
