"""``flat``: every gradient packed into buckets, one MPI Allreduce per bucket.

The base class's bucketed reduction as is: gradients are walked in name order, cut into
``bucket_bytes`` pieces that are packed into one reused staging buffer, all-reduced, and unpacked
with the 1/size scale fused (:mod:`mnify.runtime.communicators.buckets`).

``allreduce_grad_dtype`` sets the bucket's dtype (gradients are cast while packing and cast
back while unpacking). float16 buckets are summed as float16 where MPI can (Open MPI 5's
``MPI_SHORT_FLOAT``); on MPI libraries that cannot, the bucket travels as float32 -- correct, but
without the halved traffic.
"""

from __future__ import annotations

from mnify.runtime.communicators.base import CommunicatorBase


class FlatCommunicator(CommunicatorBase):
    """Packed, bucketed reductions over MPI on host memory."""

    name = "flat"
