"""``two_dimensional`` waiting in ``MPI_Waitall``: bench/multihost.py's ``two_dimensional@Ws``.

The runtime's ``two_dimensional`` always waits politely: it tests its requests a few times, then
sleeps between tests, leaving the cores to the ranks and the kernel work that have something to
do (docs/testbed.md has the measurements). To show what that buys, the bench also times the same
communicator spinning in ``MPI_Waitall`` like the other communicators; that variant is this
subclass, so the runtime needs no switch that only the bench sets.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from mnify.runtime import excepthook, finalize
from mnify.runtime.communicators.two_dimensional import TwoDimensionalCommunicator


class SpinningTwoDimensionalCommunicator(TwoDimensionalCommunicator):
    """``two_dimensional`` whose waits block in ``MPI_Waitall`` instead of sleeping."""

    def _wait(self, requests: list[MPI.Request]) -> None:
        self._wait_all(requests)


def create_spinning_two_dimensional(
    inter_host_dtype: Any = None,
) -> SpinningTwoDimensionalCommunicator:
    """The spinning variant over ``COMM_WORLD``, set up as ``create_communicator`` sets up its
    communicators (exception hook, exit barrier); collective."""
    excepthook.install()
    comm = SpinningTwoDimensionalCommunicator(MPI.COMM_WORLD, inter_host_dtype=inter_host_dtype)
    finalize.install(MPI.COMM_WORLD)
    return comm
