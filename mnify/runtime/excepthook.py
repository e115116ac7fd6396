"""The rank's exception hook: one uncaught exception ends the whole MPI job instead of hanging it.

Without this, a rank that dies leaves every other rank blocked in its next collective forever.
:func:`install` (called by ``create_communicator``) sets a ``sys.excepthook`` that prints
``[mnify] rank R (host H) failed:`` and the traceback to stderr, flushes, and calls
``MPI.COMM_WORLD.Abort(1)`` (through :func:`mnify.runtime.abort.abort_job`, which also ends this
process should the abort hang), which makes ``mpiexec`` kill every rank and exit non-zero.
``mnify run`` recognises that first line.
"""

from __future__ import annotations

import sys
import traceback
from types import TracebackType

from mpi4py import MPI

from mnify.runtime.abort import abort_job
from mnify.runtime.communicators.topology import host_name

_previous_hook = sys.excepthook
_installed = False


def failure_header() -> str:
    return f"[mnify] rank {MPI.COMM_WORLD.Get_rank()} (host {host_name()}) failed:"


def _abort_on_exception(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        # Ctrl-C: let the previous hook print as usual, then still take the job down, since a
        # rank interrupted alone would leave the others waiting.
        _previous_hook(exc_type, exc, tb)
        code = 130
    else:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        try:
            sys.stderr.write(f"{failure_header()}\n{text}")
            sys.stderr.flush()
        except Exception:
            _previous_hook(exc_type, exc, tb)
        code = 1
    sys.stdout.flush()
    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        abort_job(code)


def install() -> None:
    """Install the hook once; the hook in place before it handles what it cannot."""
    global _previous_hook, _installed
    if _installed:
        return
    _previous_hook = sys.excepthook
    sys.excepthook = _abort_on_exception
    _installed = True
