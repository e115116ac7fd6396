"""The communicator contract on MPI: what a communicator is, its topology and its lifecycle.

:class:`CommunicatorBase` is put together from one class per concept: how bytes move
(:mod:`~mnify.runtime.communicators.transport`), the array and object collectives
(:mod:`~mnify.runtime.communicators.collectives`) and gradient averaging
(:mod:`~mnify.runtime.communicators.mean_grad`). Here: the state they share, its construction,
configuration, split and release.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import numpy as np
from mpi4py import MPI

from mnify.runtime import debug, timeline
from mnify.runtime.communicators import compression, shared_memory, single_copy
from mnify.runtime.communicators.buckets import PlanCache
from mnify.runtime.communicators.collectives import Collectives
from mnify.runtime.communicators.marks import collective, mark_overrides
from mnify.runtime.communicators.mean_grad import GradientMean
from mnify.runtime.communicators.shared_memory import SharedMemoryReducer
from mnify.runtime.communicators.single_copy import SingleCopyReducer
from mnify.runtime.communicators.topology import Topology
from mnify.runtime.debug import CallSignature
from mnify.runtime.watchdog import Watchdog, timeout_from_env

# Buckets for reductions over MPI. bench/allreduce.py, 2 ranks, Open MPI 5 shared memory,
# ResNet-50's 97.5 MiB of gradients, best of 21: raw Allreduce in 256 KiB..16 MiB pieces all
# within 15% of the best (1 MiB, 18.4 ms), the whole buffer at once 1.9x; flat over MPI with
# 1/2/4/8 MiB buckets 37.9/37.3/35.8/34.8 ms. On a loaded machine larger pieces suffer less
# from every rank having to be scheduled at each collective, hence 4 MiB rather than 1.
DEFAULT_BUCKET_BYTES = 4 << 20


class CommunicatorBase(Collectives, GradientMean):
    """A communicator over a duplicate of ``mpi_comm`` (default ``COMM_WORLD``).

    Collective: every rank of ``mpi_comm`` must construct it, with the same arguments.
    """

    name: ClassVar[str] = "base"
    # average gradient buckets through a shared segment when all ranks share one host
    uses_shared_memory: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        mark_overrides(cls)  # an override of a collective publishes to the observers too

    def __init__(
        self,
        mpi_comm: MPI.Intracomm | None = None,
        *,
        allreduce_grad_dtype: Any = None,
        bucket_bytes: int | None = None,
        inter_host_dtype: Any = None,
    ) -> None:
        parent = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.mpi_comm: MPI.Intracomm = parent.Dup()
        self.topology = Topology.of(self.mpi_comm)
        self.allreduce_grad_dtype: np.dtype[Any] | None = (
            None if allreduce_grad_dtype is None else np.dtype(allreduce_grad_dtype)
        )
        # what shares cross hosts in (:mod:`~mnify.runtime.communicators.compression`)
        self.inter_host_dtype = compression.inter_host_dtype(inter_host_dtype)
        self.bucket_bytes = int(bucket_bytes) if bucket_bytes else DEFAULT_BUCKET_BYTES
        if self.bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self._seq = 0
        self._debug = debug.enabled()
        timeout = timeout_from_env()
        self._watchdog = Watchdog(self.mpi_comm, timeout) if timeout else None
        self._plans = PlanCache()
        self._finalized = False
        self._batched_copy = True
        self._config_depth = 0
        self._make_comms()
        # made now, while construction is a blocking collective anyway (the watchdog times
        # collectives, not set-up); None when not wanted (MNIFY_SHARED_MEMORY=0) or possible
        self._shm: SharedMemoryReducer | None = None
        if self.uses_shared_memory and shared_memory.enabled_by_env():
            self._shm = self._create_shared_memory()
        # every rank on one host with a segment: means without staging, where the kernel lets
        # ranks reach each other's memory (probed collectively; None elsewhere)
        self._single_copy: SingleCopyReducer | None = None
        self._mean_paths = {}  # per gradient list: single copy or the segment, measured
        if self._shm is not None and self._shm.size == self.size and single_copy.enabled_by_env():
            self._single_copy = SingleCopyReducer.create(self.mpi_comm)
        if (
            self.inter_host_dtype is not None
            and self.topology.inter_size > 1
            and not self.compresses_between_hosts
        ):
            warnings.warn(
                f"inter_host_dtype={self.inter_host_dtype} is ignored: the {self.name} "
                "communicator has no share stage to narrow (two_dimensional on hosts with "
                "equal rank counts has); gradients cross hosts in full precision",
                stacklevel=3,
            )
        # MNIFY_TIMELINE: when every rank records, the timeline observes this instance
        timeline.attach(self)

    @property
    def compresses_between_hosts(self) -> bool:
        """Whether ``inter_host_dtype`` narrows what crosses hosts here (two_dimensional)."""
        return False

    # -- topology -------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def intra_rank(self) -> int:
        return self.topology.intra_rank

    @property
    def intra_size(self) -> int:
        return self.topology.intra_size

    @property
    def inter_rank(self) -> int:
        return self.topology.inter_rank

    @property
    def inter_size(self) -> int:
        return self.topology.inter_size

    @property
    def host_name(self) -> str:
        return self.topology.host_name

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} rank {self.rank}/{self.size} "
            f"host {self.host_name!r} intra {self.intra_rank}/{self.intra_size} "
            f"inter {self.inter_rank}/{self.inter_size}>"
        )

    def _make_comms(self) -> None:
        """Hook for subclasses: create further MPI communicators (collective, in __init__)."""

    # -- configuration (ChainerMN's set_config) --------------------------------------------------

    CONFIG_NAMES: ClassVar[tuple[str, ...]] = (
        "allreduce_grad_dtype",
        "bucket_bytes",
        "batched_copy",
    )

    def set_config(self, name: str, value: Any = True, **kwargs: Any) -> None:
        """ChainerMN's ``comm.set_config``: ``allreduce_grad_dtype`` (bucket dtype, None for the
        gradients' own), ``bucket_bytes``; ``batched_copy`` is accepted and ignored (host
        communicators always pack)."""
        if name == "allreduce_grad_dtype":
            self.allreduce_grad_dtype = None if value is None else np.dtype(value)
        elif name == "bucket_bytes":
            if int(value) <= 0:
                raise ValueError(f"bucket_bytes must be positive, got {value}")
            self.bucket_bytes = int(value)
        elif name == "batched_copy":
            self._batched_copy = bool(value)
        else:
            raise ValueError(f"unknown config {name!r}; expected one of {self.CONFIG_NAMES}")

    def get_config(self, name: str | None = None) -> Any:
        values = {
            "allreduce_grad_dtype": self.allreduce_grad_dtype,
            "bucket_bytes": self.bucket_bytes,
            "batched_copy": self._batched_copy,
        }
        if name is None:
            return values
        if name not in values:
            raise ValueError(f"unknown config {name!r}; expected one of {self.CONFIG_NAMES}")
        return values[name]

    @contextlib.contextmanager
    def config_scope(self) -> Iterator[None]:
        """Configuration changed inside the block is restored when it ends."""
        saved = self.get_config()
        self._config_depth += 1
        try:
            yield
        finally:
            self._config_depth -= 1
            for key, val in saved.items():
                self.set_config(key, val)

    @property
    def within_config_scope(self) -> bool:
        return self._config_depth > 0

    # -- lifecycle ------------------------------------------------------------------------------

    def __copy__(self) -> CommunicatorBase:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> CommunicatorBase:
        # A communicator is a handle on the job, not data: a deep copy of a model that holds one
        # (``Link.copy(mode='copy')``, ``copy.deepcopy(model)``) must share it, not fail to pickle
        # an MPI communicator.
        return self

    @collective
    def split(self, color: int, key: int) -> CommunicatorBase:
        """A communicator of the same class over the ranks that passed the same ``color``,
        ordered by ``key``."""
        self._enter(CallSignature("split"))
        sub = cast(MPI.Intracomm, self.mpi_comm.Split(color, key))
        try:
            return type(self)(sub, **self._split_settings())
        finally:
            sub.Free()

    def _split_settings(self) -> dict[str, Any]:
        """Constructor settings a communicator made by :meth:`split` inherits from this one."""
        return {
            "allreduce_grad_dtype": self.allreduce_grad_dtype,
            "bucket_bytes": self.bucket_bytes,
            "inter_host_dtype": self.inter_host_dtype,
        }

    def _free_comms(self) -> None:
        """Free the MPI communicators this instance owns (subclasses add theirs)."""
        self.mpi_comm.Free()

    def finalize(self) -> None:
        """Stop the watchdog and free the duplicated communicators (idempotent)."""
        if self._finalized:
            return
        self._finalized = True
        if self._watchdog is not None:
            self._watchdog.close()
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        self._single_copy = None
        if not MPI.Is_finalized():
            self._free_comms()
