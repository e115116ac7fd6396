"""MN202 ``multiprocess-iterator-without-forkserver``: MultiprocessIterator without the forkserver
preamble before the communicator.

Its documentation (docs/rules.md, ``mnify explain MN202``) is generated from the rule class below.
The fix is here too: :func:`fix`, the converter step ``fork-hazard`` (MN808, docs/converter.md).
Fixture: fixtures/lint/MN202.py.

Family: MN2xx: fork under MPI. Open MPI's registered memory does not survive ``fork()``: a child
process can corrupt the parent's buffers, and the job dies with ``mpirun noticed that process rank
0 ... exited on signal 6 (Aborted)`` or hangs.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import Rule
from mnify.hazards.start_method import start_method
from mnify.program.context import LintContext
from mnify.rewrites import global_data
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import statement
from mnify.rewrites.registry import rewrite


def _before(first: tuple[int, cst.CSTNode], second: tuple[int, cst.CSTNode]) -> bool:
    """``first`` runs before ``second``: earlier in one scope, or module level vs a function."""
    if first[1] is second[1]:
        return first[0] < second[0]
    return isinstance(first[1], cst.Module)


class MultiprocessIteratorWithoutForkserver(Rule):
    """Fires on each ``chainer.iterators.MultiprocessIterator(...)`` call when the script lacks
    the forkserver preamble: a ``multiprocessing.set_start_method('forkserver')`` call and a
    ``multiprocessing.Process(...)`` construction, both before the first communicator is created
    (earlier in the same function, or at module level when the communicator is created inside a
    function). In a script without a communicator both calls must simply exist."""

    code = "MN202"
    name = "multiprocess-iterator-without-forkserver"
    summary = "MultiprocessIterator without the forkserver preamble before the communicator"
    why = (
        "MultiprocessIterator forks worker processes. Forking after MPI is initialised breaks "
        "Open MPI (signal 6, hangs). Starting a forkserver before the communicator exists makes "
        "later workers come from a clean, MPI-free process."
    )
    bad = (
        "comm = chainermn.create_communicator()\n"
        "it = chainer.iterators.MultiprocessIterator(train, 32)\n"
    )
    good = (
        "multiprocessing.set_start_method('forkserver')\n"
        "p = multiprocessing.Process()\n"
        "p.start()\n"
        "p.join()\n"
        "comm = chainermn.create_communicator()\n"
        "it = chainer.iterators.MultiprocessIterator(train, 32)\n"
    )
    fixable = True

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._iterators: list[cst.Call] = []
        # (call index, scope node) of the first forkserver setting and process construction
        self._forkserver: tuple[int, cst.CSTNode] | None = None
        self._process: tuple[int, cst.CSTNode] | None = None
        self._communicator: tuple[int, cst.CSTNode] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        names = ctx.callee_names(node)
        if not names:
            return
        here = (ctx.call_index, ctx.scope_node)
        if N.any_is(names, N.is_multiprocess_iterator):
            self._iterators.append(node)
        elif N.any_in(names, N.START_METHOD_SETTERS):
            if start_method(ctx, node) == "forkserver" and self._forkserver is None:
                self._forkserver = here
        elif N.any_in(names, N.PROCESS_CLASS):
            if self._process is None:
                self._process = here
        elif N.any_in(names, N.COMMUNICATOR_FACTORIES) and self._communicator is None:
            self._communicator = here

    def finish(self) -> None:
        if self._preamble_ok():
            return
        for node in self._iterators:
            self.report(node)

    def _preamble_ok(self) -> bool:
        if self._forkserver is None or self._process is None:
            return False
        if self._communicator is None:
            return True
        return _before(self._forkserver, self._communicator) and _before(
            self._process, self._communicator
        )


# ------------------------------------------------------------------------------------ fix
FIX_DOC = """docs/design.md §1, step "fork hazards": forking an MPI process can corrupt or crash it.

``MultiprocessIterator`` forks worker processes, so the forkserver preamble
(``multiprocessing.set_start_method('forkserver')`` and one dummy process started and joined)
goes in before the communicator is created: later workers are forked from the clean server,
never from the MPI process. Other fork hazards (``subprocess``, ``os.system``, ``os.fork``,
``multiprocessing``, ``DumpGraph``) have no safe rewrite: ``mnify lint``'s MN2xx rules find them
in the converted output and the report lists them for a person.
"""


@rewrite("fork-hazard", order=90, fixes=("MN202",), code="MN808", doc=FIX_DOC)
def fix(ctx: FileContext) -> None:
    """Reports hazards; sets ``ctx.preamble``, what goes before the communicator (maybe none)."""
    ctx.preamble = _plan(ctx)


def _plan(ctx: FileContext) -> list[cst.BaseStatement]:
    facts = ctx.facts
    has_preamble = any(c.qname == "multiprocessing.set_start_method" for c in facts.calls)
    # --data global replaces a training MultiprocessIterator by the global iterator: no workers
    mp_calls = [
        c
        for c in facts.calls
        if N.is_multiprocess_iterator(c.qname) and not global_data.replaces(ctx, c)
    ]
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
