"""``flat``: every gradient packed into buckets, one reduction per bucket.

The base class's bucketed reduction as is: gradients are walked in name order, cut into
``bucket_bytes`` pieces that are packed into one reused staging buffer, all-reduced, and unpacked
with the 1/size scale fused (:mod:`mnify.runtime.communicators.buckets`). When every rank
runs on one host, buckets are averaged through a shared-memory segment instead of MPI Allreduce
(one pass over the gradients instead of two, :mod:`mnify.runtime.communicators.shared_memory`),
or each rank reduces its share straight from the others' gradient arrays
(:mod:`mnify.runtime.communicators.single_copy`), whichever its first calls measure faster;
``MNIFY_SHARED_MEMORY=0`` turns both off.

``allreduce_grad_dtype`` sets the bucket's dtype (gradients are cast while packing and cast
back while unpacking). float16 buckets are summed as float16 where MPI can (Open MPI 5's
``MPI_SHORT_FLOAT``); on MPI libraries that cannot, the bucket travels as float32 -- correct, but
without the halved traffic.
"""

from __future__ import annotations

from mnify.runtime.communicators.base import CommunicatorBase


class FlatCommunicator(CommunicatorBase):
    """Packed, bucketed reductions on host memory: through shared memory on one host, MPI
    Allreduce across hosts."""

    name = "flat"
    uses_shared_memory = True
