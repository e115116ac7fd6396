"""``hierarchical``: reduce inside each host, all-reduce among host leaders, broadcast back.

Only one rank per host (its leader, ``intra_rank == 0``) sends over the network, so inter-host
traffic shrinks by the number of ranks per host. Packing and bucketing are the flat
communicator's; only how one bucket is all-reduced differs. Gradient buckets take the intra-host
stages through a shared-memory segment per host when every host can make one (each rank writes
its scaled bucket, the leader sums them and all-reduces the sum with the other leaders, every
rank reads the result back); ``MNIFY_SHARED_MEMORY=0`` keeps them on MPI Reduce/Bcast.
"""

from __future__ import annotations

from typing import cast

import numpy as np
from mpi4py import MPI

from mnify.runtime.communicators import shared_memory
from mnify.runtime.communicators.base import CommunicatorBase
from mnify.runtime.communicators.shared_memory import SharedMemoryReducer


class HierarchicalCommunicator(CommunicatorBase):
    """Two-level reductions: intra-host Reduce, inter-leader Allreduce, intra-host Bcast."""

    name = "hierarchical"
    uses_shared_memory = True

    intra_comm: MPI.Comm  # the ranks of this host
    inter_comm: MPI.Comm  # the hosts' leaders (COMM_NULL on other ranks)

    def _make_comms(self) -> None:
        self.intra_comm = self.mpi_comm.Split(self.inter_rank, self.rank)
        leader = self.intra_rank == 0
        self.inter_comm = self.mpi_comm.Split(0 if leader else MPI.UNDEFINED, self.rank)

    def _allreduce_into(self, send: np.ndarray, recv: np.ndarray, op: MPI.Op) -> None:
        leader = self.intra_rank == 0
        in_place = send is recv
        for s_piece, r_piece in zip(self._chunks(send), self._chunks(recv), strict=True):
            if self.intra_size > 1:
                if leader:
                    source = MPI.IN_PLACE if in_place else s_piece
                    self._mpi(self.intra_comm, "Reduce", source, r_piece, op, root=0)
                else:
                    self._mpi(self.intra_comm, "Reduce", s_piece, None, op, root=0)
            elif not in_place:
                np.copyto(r_piece, s_piece)
            if leader and self.inter_size > 1:
                self._mpi(self.inter_comm, "Allreduce", MPI.IN_PLACE, r_piece, op)
            if self.intra_size > 1:
                self._mpi(self.intra_comm, "Bcast", r_piece, root=0)

    def _create_shared_memory(self) -> SharedMemoryReducer | None:
        """A segment per host (a host with one rank too, so every leader scales alike); used
        only if every host got one, so all leaders run the same inter-host collectives."""
        intra = cast(MPI.Intracomm, self.intra_comm)
        # one slot size everywhere (from the most crowded host): every host must cut the same
        # buckets, or the leaders' inter-host allreduces would not match
        crowded = max(len(self.topology.ranks_on(h)) for h in self.topology.hosts)
        slot = shared_memory.slot_size(self.bucket_bytes, crowded)
        shm = SharedMemoryReducer.create(intra, slot)
        if self.mpi_comm.allreduce(shm is not None, op=MPI.LAND):
            return shm
        if shm is not None:
            shm.close()
        return None

    def _shared_mean(
        self, shm: SharedMemoryReducer, views: list[np.ndarray], buf: np.ndarray, scale: float
    ) -> None:
        def across_hosts(result: np.ndarray) -> None:
            self._mpi(self.inter_comm, "Allreduce", MPI.IN_PLACE, result, MPI.SUM)

        shm.mean_through_leader(
            views,
            buf,
            scale,
            lambda: self._mpi(self.intra_comm, "Barrier"),
            across_hosts if self.inter_size > 1 else None,
        )

    def _free_comms(self) -> None:
        self.intra_comm.Free()
        if self.inter_comm != MPI.COMM_NULL:
            self.inter_comm.Free()
        super()._free_comms()
