"""Communicators: the ChainerMN communicator API on mpi4py (and NCCL on GPUs).

``create_communicator(name)`` names:

- ``naive``: one MPI Allreduce per gradient, host memory (ChainerMN's ``naive``).
- ``flat``: gradients packed into buckets, one Allreduce per bucket, 1/size fused.
- ``hierarchical``: flat's buckets, reduced inside each host, across host leaders, then
  broadcast inside each host.
- ``two_dimensional``: reduce-scatter inside each host, rank i of every host all-reduces share
  i across hosts, all-gather inside each host; the stages of consecutive buckets overlap
  (hierarchical's scheme where hosts run different numbers of ranks).
- ``pure_nccl``: NCCL on CuPy arrays (:mod:`mnify.runtime.communicators.pure_nccl`).
- ``auto``: ``pure_nccl`` when every rank's CuPy sees a GPU; on CPU, when the ranks span several
  hosts and some host runs several ranks, ``two_dimensional`` if the hosts are separate
  machines (no shared memory between them) running the same number of ranks each, else
  ``hierarchical``; otherwise ``flat`` (the design said ``naive``; ``flat`` is the same contract
  and measured faster, see bench/allreduce.py).

Creating any communicator installs :mod:`mnify.runtime.excepthook`'s exception hook, so one rank's
uncaught exception ends the whole job, and :mod:`mnify.runtime.finalize`'s exit barrier, so
ranks that leave normally meet before ``MPI_Finalize`` (a singleton removes its Open MPI
files), and starts :mod:`mnify.runtime.write_net` unless ``MNIFY_WRITE_NET=0``; with
``MNIFY_VERIFY=K`` set (``mnify run --verify``) it also starts :mod:`mnify.runtime.verify`.
Nothing here imports Chainer (verification aside); CuPy only when asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from mpi4py import MPI

from mnify import environment
from mnify.runtime.communicators.base import CommunicatorBase
from mnify.runtime.communicators.topology import Topology, host_name

__all__ = ["CommunicatorBase", "create_communicator", "current_communicator", "NAMES"]

# name -> (module, class)
_CLASSES: dict[str, tuple[str, str]] = {
    "naive": ("mnify.runtime.communicators.naive", "NaiveCommunicator"),
    "flat": ("mnify.runtime.communicators.flat", "FlatCommunicator"),
    "hierarchical": ("mnify.runtime.communicators.hierarchical", "HierarchicalCommunicator"),
    "two_dimensional": (
        "mnify.runtime.communicators.two_dimensional",
        "TwoDimensionalCommunicator",
    ),
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
    if not topology.spans_hosts_with_several_ranks:
        return "flat"
    # Hosts that really are separate machines (MPI cannot share memory across them) and all
    # run the same number of ranks: the pipelined two-dimensional scheme. bench/multihost.py on
    # the 2x2 test bed (1 Gbit/s links, ResNet-50's 102 MB, link floor 0.82 s, 2 cores shared
    # with other jobs), three launches of 5 interleaved reps at load 3.4-5.0, medians:
    # two_dimensional 0.91 / 0.89 / 0.92 s (1.09-1.12x the floor, every rep 0.89-0.95 s),
    # hierarchical 0.99 / 0.96 / 0.95 s (reps 0.88-1.34), flat 1.05 / 0.95 / 1.17 s (reps
    # 0.91-3.47; medians of 2.5-14 s in other launches: Open MPI's han, docs/testbed.md).
    # Elsewhere (uneven hosts; host names faked on one machine, where there is no link to keep
    # busy) hierarchical, as before.
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    apart = node.Get_size() < mpi_comm.Get_size()
    node.Free()
    apart = bool(mpi_comm.allreduce(apart, op=MPI.LAND))
    if apart and topology.hosts_equally_crowded:
        return "two_dimensional"
    return "hierarchical"


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
    inter_host_dtype: Any = None,
) -> CommunicatorBase:
    """A communicator over ``mpi_comm`` (default ``COMM_WORLD``); collective over its ranks.

    ``inter_host_dtype=np.float16`` rounds what crosses hosts to float16, halving inter-host
    bytes (two_dimensional; :mod:`~mnify.runtime.communicators.compression` has the caveat).
    """
    from mnify.runtime import excepthook, finalize

    excepthook.install()
    comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    if name == "auto":
        name = choose_auto(comm)
    cls = communicator_class(name)
    made = cls(
        comm,
        allreduce_grad_dtype=allreduce_grad_dtype,
        bucket_bytes=bucket_bytes,
        inter_host_dtype=inter_host_dtype,
    )
    finalize.install(comm)
    if environment.WRITE_NET.read():  # files two ranks write, reported at a normal exit
        from mnify.runtime import write_net

        write_net.start()
        write_net.report_at_exit()
    global _current
    _current = made
    wiring = environment.LAUNCH.read_or_default()
    if wiring.phase_stop or wiring.phase_resume:  # mnify run --grow-ranks
        from mnify.runtime import phases

        phases.install(made, wiring.phase_stop, wiring.phase_snapshot, wiring.phase_resume)
    if environment.VERIFY.is_set():  # mnify run --verify, or MNIFY_VERIFY=K by hand
        from mnify.runtime.verify import start_if_requested

        start_if_requested()
    return made


_current: CommunicatorBase | None = None


def current_communicator() -> CommunicatorBase:
    """The communicator this process created last with :func:`create_communicator`.

    For code that cannot be handed one: a script's training helper keeps its signature when
    ``mnify convert`` makes it data-parallel, and fetches the entry point's communicator here
    (as ``hvd.rank()`` or torch's default process group are reachable anywhere).
    """
    if _current is None:
        raise RuntimeError(
            "no communicator yet: call mn.create_communicator() before the code that uses it"
        )
    return _current
