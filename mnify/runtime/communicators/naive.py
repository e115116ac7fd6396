"""``naive``: ChainerMN's simplest communicator -- one MPI Allreduce per gradient array.

No packing: each array (staged to the host if it lives on a GPU) is reduced on its own and then
scaled. It is the reference the packed communicators are measured against, and the one to use
when in doubt about packing.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators.base import CommunicatorBase


class NaiveCommunicator(CommunicatorBase):
    """Per-array reductions over MPI on host memory."""

    name = "naive"

    def _reduce_arrays(self, arrays: list[np.ndarray], scale: float) -> None:
        for a in arrays:
            wire = arr.reduction_dtype(a.dtype)
            if wire == a.dtype and a.flags.c_contiguous:
                self._allreduce_bucket(a, a, MPI.SUM)
                if scale != 1.0:
                    np.multiply(a, scale, out=a, casting="unsafe")
            else:
                buf = np.array(a, dtype=wire, order="C", copy=True)
                self._allreduce_bucket(buf, buf, MPI.SUM)
                np.multiply(buf, scale, out=a, casting="unsafe")
