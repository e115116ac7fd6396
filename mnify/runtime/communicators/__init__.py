"""Communicators: the ChainerMN communicator API on mpi4py (and NCCL on GPUs).

``create_communicator(name)`` names:

- ``naive``: one MPI Allreduce per gradient, host memory (ChainerMN's ``naive``).
- ``flat``: gradients packed into buckets, one Allreduce per bucket, 1/size fused.
- ``hierarchical``: flat's buckets, reduced inside each host, across host leaders, then
  broadcast inside each host.
- ``pure_nccl``: NCCL on CuPy arrays (:mod:`mnify.runtime.communicators.pure_nccl`).
- ``auto``: ``pure_nccl`` when every rank's CuPy sees a GPU; on CPU ``hierarchical`` when the
  ranks span several hosts and some host runs several ranks, else ``flat`` (DESIGN.md said
  ``naive``; ``flat`` is the same contract and measured faster, see bench/allreduce.py).

Creating any communicator installs :mod:`mnify.runtime.excepthook`'s exception hook, so one rank's
uncaught exception ends the whole job. Nothing here imports Chainer; CuPy only when asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from mpi4py import MPI

from mnify.runtime.communicators.base import CommunicatorBase
from mnify.runtime.communicators.topology import Topology, host_name

__all__ = ["CommunicatorBase", "create_communicator", "NAMES"]

# name -> (module, class)
_CLASSES: dict[str, tuple[str, str]] = {
    "naive": ("mnify.runtime.communicators.naive", "NaiveCommunicator"),
    "flat": ("mnify.runtime.communicators.flat", "FlatCommunicator"),
    "hierarchical": ("mnify.runtime.communicators.hierarchical", "HierarchicalCommunicator"),
    "pure_nccl": ("mnify.runtime.communicators.pure_nccl", "PureNcclCommunicator"),
}
NAMES = ("auto", *_CLASSES)


def _sees_gpu() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


def choose_auto(mpi_comm: MPI.Intracomm) -> str:
    """The name ``auto`` resolves to; collective, and the same answer on every rank."""
    views = mpi_comm.allgather((host_name(), _sees_gpu()))
    if all(gpu for _, gpu in views):
        return "pure_nccl"
    topology = Topology.from_names(mpi_comm.Get_rank(), [name for name, _ in views])
    return "hierarchical" if topology.spans_hosts_with_several_ranks else "flat"


def communicator_class(name: str) -> type[CommunicatorBase]:
    try:
        module, cls = _CLASSES[name]
    except KeyError:
        raise ValueError(
            f"unknown communicator {name!r}; expected one of {', '.join(NAMES)}"
        ) from None
    found: type[CommunicatorBase] = getattr(importlib.import_module(module), cls)
    return found


def create_communicator(
    name: str = "auto",
    mpi_comm: MPI.Intracomm | None = None,
    *,
    allreduce_grad_dtype: Any = None,
    bucket_bytes: int | None = None,
) -> CommunicatorBase:
    """A communicator over ``mpi_comm`` (default ``COMM_WORLD``); collective over its ranks."""
    from mnify.runtime import excepthook

    excepthook.install()
    comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    if name == "auto":
        name = choose_auto(comm)
    cls = communicator_class(name)
    return cls(comm, allreduce_grad_dtype=allreduce_grad_dtype, bucket_bytes=bucket_bytes)
