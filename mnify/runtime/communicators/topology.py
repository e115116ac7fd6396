"""Which ranks share a host: intra (within a host) and inter (across hosts) ranks.

GPU ids are per host, so a converted script uses ``comm.intra_rank`` as its device. Ranks are
grouped by ``MPI.Get_processor_name()``; ``MNIFY_HOSTNAME`` overrides the name so tests can fake
several hosts on one machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpi4py import MPI

from mnify import environment


def host_name() -> str:
    """This rank's host name: ``MNIFY_HOSTNAME`` if set, else MPI's processor name."""
    return environment.HOSTNAME.read() or MPI.Get_processor_name()


@dataclass(frozen=True)
class Topology:
    """Where every rank of a communicator lives, seen from one rank.

    ``hosts`` lists hosts in order of their lowest rank; ``inter_rank`` is this rank's host's index
    in that list, ``intra_rank`` its position among the ranks on its host (in rank order).
    """

    rank: int
    size: int
    host_name: str
    host_of_rank: tuple[str, ...]
    hosts: tuple[str, ...]
    intra_rank: int
    intra_size: int
    inter_rank: int
    inter_size: int

    @classmethod
    def from_names(cls, rank: int, names: list[str]) -> Topology:
        hosts: list[str] = []
        for name in names:
            if name not in hosts:
                hosts.append(name)
        mine = names[rank]
        same_host = [r for r, n in enumerate(names) if n == mine]
        return cls(
            rank=rank,
            size=len(names),
            host_name=mine,
            host_of_rank=tuple(names),
            hosts=tuple(hosts),
            intra_rank=same_host.index(rank),
            intra_size=len(same_host),
            inter_rank=hosts.index(mine),
            inter_size=len(hosts),
        )

    @classmethod
    def of(cls, comm: MPI.Intracomm) -> Topology:
        """Collective: every rank of ``comm`` must call it."""
        names = comm.allgather(host_name())
        return cls.from_names(comm.Get_rank(), names)

    def ranks_on(self, host: str) -> list[int]:
        return [r for r, n in enumerate(self.host_of_rank) if n == host]

    @property
    def spans_hosts_with_several_ranks(self) -> bool:
        """More than one host, and at least one of them runs more than one rank: where the
        hierarchical reduction saves inter-host traffic."""
        return self.inter_size > 1 and any(len(self.ranks_on(h)) > 1 for h in self.hosts)

    @property
    def hosts_equally_crowded(self) -> bool:
        """Every host runs the same number of ranks: rank i of each host can pair up with rank
        i of every other (the two-dimensional scheme's columns)."""
        return len({len(self.ranks_on(h)) for h in self.hosts}) == 1
