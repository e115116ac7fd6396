"""Ending the whole MPI job from one rank, even when ``MPI_Abort`` itself hangs.

``MPI_Abort`` asks mpiexec to kill every rank. With Open MPI 5 it has been seen to hang instead
(another thread of the rank inside MPI, or a host whose daemon is gone), which leaves the job
waiting forever: the one outcome the runtime promises never to produce. So before calling it we
arm faulthandler's watchdog, a C thread that needs no GIL: if the process is still alive
``MNIFY_ABORT_FALLBACK`` seconds later (default 5), it leaves with ``_exit``. mpiexec then sees a
rank end without ``MPI_Finalize`` and ends the job itself.
"""

from __future__ import annotations

import faulthandler
import os
from typing import IO, NoReturn

from mnify import environment

_sink: IO[str] | None = None  # faulthandler writes its traceback dump here; kept open on purpose


def fallback_seconds() -> float:
    """Seconds from ``MNIFY_ABORT_FALLBACK`` (at least 0.5); a bad value is said and ignored:
    the job is being ended."""
    return max(0.5, environment.ABORT_FALLBACK.read_or_default())


def abort_job(code: int) -> NoReturn:
    """End every rank of the job with ``code`` (this process at least, in all cases)."""
    global _sink
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        if _sink is None:
            _sink = open(os.devnull, "w")  # noqa: SIM115 - must outlive this call
        faulthandler.dump_traceback_later(fallback_seconds(), exit=True, file=_sink)
        MPI.COMM_WORLD.Abort(code)
    os._exit(code)
