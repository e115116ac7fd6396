"""Rank script: topology, gradient averaging and scatter_dataset on ranks spread over real hosts.

Runs on the test bed (hosts are network + UTS namespaces). Each rank prints one line
``RESULT {json}`` with what it saw; the pytest side compares the topology with the hostfile's
slots. Numerical checks run here and raise on a mismatch (the failure hook then ends the job):

- ``allreduce`` and ``multi_node_mean_grad`` of every communicator equal a float64 reference
  every rank computes from the known per-rank inputs, and are bit-identical on all ranks;
- ``hierarchical``, ``two_dimensional`` and ``flat`` agree with each other (the one-host result,
  up to summation order);
- ``scatter_dataset`` gives every rank its ChainerMN share and the shares cover the dataset.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from mnify import runtime as mn
from mnify.runtime.communicators import CommunicatorBase

SHAPES = [(3, 5), (7,), (2, 3, 4), (1000,), (64, 33)]  # odd sizes straddle bucket boundaries


class Param:
    def __init__(self, data: np.ndarray, grad: np.ndarray | None) -> None:
        self.data = data
        self.grad = grad


class Model:
    """Anything with ``namedparams()`` (a Chainer Link has it)."""

    def __init__(self, params: dict[str, Param]) -> None:
        self.params = params

    def namedparams(self) -> list[tuple[str, Param]]:
        return list(self.params.items())


def grads_of(rank: int) -> list[np.ndarray]:
    rng = np.random.RandomState(1000 + rank)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def identical_everywhere(comm: CommunicatorBase, x: np.ndarray, what: str) -> None:
    digests = comm.mpi_comm.allgather(x.tobytes())
    if any(d != digests[0] for d in digests):
        raise AssertionError(f"{what}: ranks disagree bit for bit")


def check_averaging(comm: CommunicatorBase) -> list[np.ndarray]:
    size, rank = comm.size, comm.rank
    every = [grads_of(r) for r in range(size)]
    mean = [np.mean([g[i].astype(np.float64) for g in every], axis=0) for i in range(len(SHAPES))]

    summed = comm.allreduce(grads_of(rank)[3])
    np.testing.assert_allclose(summed, mean[3] * size, rtol=1e-5, atol=1e-5)
    identical_everywhere(comm, summed, f"{comm.name} allreduce")
    biggest = comm.allreduce(np.full(4, rank, np.float32), op="max")
    assert biggest.tolist() == [size - 1] * 4, biggest

    model = Model(
        {
            f"p{i}": Param(np.zeros(s, np.float32), g)
            for i, (s, g) in enumerate(zip(SHAPES, grads_of(rank), strict=True))
        }
    )
    comm.multi_node_mean_grad(model)
    got = [model.params[f"p{i}"].grad for i in range(len(SHAPES))]
    for i, g in enumerate(got):
        assert g is not None
        np.testing.assert_allclose(g, mean[i], rtol=1e-5, atol=1e-6, err_msg=f"{comm.name} p{i}")
        identical_everywhere(comm, g, f"{comm.name} mean grad p{i}")
    return [g for g in got if g is not None]


def check_scatter(comm: CommunicatorBase) -> list[int]:
    n = 23  # not a multiple of 2, 3 or 4: uneven shares
    dataset = np.arange(n, dtype=np.int64) if comm.rank == 0 else None
    mine = mn.scatter_dataset(dataset, comm, shuffle=True, seed=5)
    shares = comm.allgather_obj([int(v) for v in mine])
    covered = sorted({v for share in shares for v in share})
    assert covered == list(range(n)), shares
    assert len({len(s) for s in shares}) == 1, shares  # force_equal_length
    return [int(v) for v in mine]


def main() -> None:
    results: dict[str, object] = {
        "rank": MPI.COMM_WORLD.Get_rank(),
        "processor": MPI.Get_processor_name(),
    }
    averaged: dict[str, list[np.ndarray]] = {}
    for name in ("hierarchical", "two_dimensional", "flat", "naive"):
        comm = mn.create_communicator(name)
        results[name] = [comm.intra_rank, comm.intra_size, comm.inter_rank, comm.inter_size]
        averaged[name] = check_averaging(comm)
        if name == "hierarchical":
            results["scatter"] = check_scatter(comm)
        comm.finalize()
    for other in ("hierarchical", "two_dimensional"):
        for a, b in zip(averaged[other], averaged["flat"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=other)
    auto = mn.create_communicator("auto")
    results["auto"] = auto.name
    auto.finalize()
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
