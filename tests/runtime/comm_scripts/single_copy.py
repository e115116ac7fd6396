"""Rank script: means on one host by single copy (cross-memory attach) against the segment.

Checks, each printing ``PASS <name>`` (a failing check raises):

- ``probe``: every rank can reach every other's memory, so ``flat`` made a single-copy reducer;
  a rank that cannot (``process_vm_*`` missing, simulated on the last rank) makes every rank
  fall back to the segment, not only that one;
- ``same-bits``: ``MNIFY_SINGLE_COPY=1`` and ``=0`` (the segment) give the same bits, for means
  and sums, float32 and float64, odd sizes, empty and non-contiguous arrays, tiny chunks (a
  share cut into many I/O vectors, some capped at a few pieces) and the default; the result
  equals a float64 reference and every rank holds the same bits;
- ``choice``: the default communicator times both paths on its first calls and every rank
  keeps the same one; the results are the same bits as the forced paths'.
"""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from mnify import environment
from mnify import runtime as mn
from mnify.runtime.communicators import single_copy
from tests.support.rank_checks import GradientModel

SHAPES = [(3, 5), (0,), (7,), (1000,), (64, 33), (300_000,), (1,), (17, 19), (4096,)]


def grads_of(rank: int, dtype: type, salt: int) -> list[np.ndarray]:
    rng = np.random.RandomState(900 + 13 * rank + salt)
    grads = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    grads[4] = np.asfortranarray(grads[4])  # non-contiguous: copied, reduced, written back
    return grads


def made(env: str) -> mn.CommunicatorBase:
    os.environ[environment.SINGLE_COPY.name] = env
    try:
        return mn.create_communicator("flat")
    finally:
        del os.environ[environment.SINGLE_COPY.name]


def digest(arrays: list[np.ndarray]) -> bytes:
    return b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)


def main() -> None:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()

    forced, segment = made("1"), made("0")
    assert forced._single_copy is not None, "single copy refused on one host"  # type: ignore[attr-defined]
    assert segment._single_copy is None  # type: ignore[attr-defined]
    real = single_copy._syscalls
    if rank == size - 1:
        single_copy._syscalls = lambda: None  # type: ignore[assignment]
    refused = made("1")
    single_copy._syscalls = real
    assert refused._single_copy is None, "one rank refused, yet this rank took single copy"  # type: ignore[attr-defined]
    print("PASS probe", flush=True)

    settings = [(None, None), (4096, None), (256, 3)]  # (chunk bytes, pieces per I/O vector)
    for chunk, iov_max in settings:
        default_chunk, default_iov = single_copy.CHUNK_BYTES, single_copy._IOV_MAX
        single_copy.CHUNK_BYTES = chunk or default_chunk
        single_copy._IOV_MAX = iov_max or default_iov
        try:
            for dtype in (np.float32, np.float64):
                for division in (True, False):
                    for salt in range(2):
                        a, b = grads_of(rank, dtype, salt), grads_of(rank, dtype, salt)
                        if division:
                            forced.multi_node_mean_grad(GradientModel(a))
                            segment.multi_node_mean_grad(GradientModel(b))
                        else:
                            forced.all_reduce(a)
                            segment.all_reduce(b)
                        what = f"chunk={chunk} iov={iov_max} {np.dtype(dtype)} div={division}"
                        assert digest(a) == digest(b), f"{what}: single copy != segment"
                        assert len(set(world.allgather(digest(a)))) == 1, f"{what}: ranks differ"
                        every = [grads_of(q, np.float64, salt) for q in range(size)]
                        for i, got in enumerate(a):
                            want = sum(e[i] for e in every) / (size if division else 1)
                            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
                            assert got.flags.f_contiguous == (i == 4) or got.ndim < 2
        finally:
            single_copy.CHUNK_BYTES, single_copy._IOV_MAX = default_chunk, default_iov
    print("PASS same-bits", flush=True)

    chooser = mn.create_communicator("flat")
    for step in range(8):
        a, b = grads_of(rank, np.float32, step), grads_of(rank, np.float32, step)
        chooser.multi_node_mean_grad(GradientModel(a))
        forced.multi_node_mean_grad(GradientModel(b))
        assert digest(a) == digest(b), f"step {step}: the chosen path changed the bits"
    choices = list(chooser._mean_paths.values())  # type: ignore[attr-defined]
    assert len(choices) == 1 and choices[0].chosen in ("single_copy", "segment"), choices
    histories = world.allgather(choices[0].history)
    assert all(h == histories[0] for h in histories), histories
    print("PASS choice", flush=True)
    for comm in (forced, segment, refused, chooser):
        comm.finalize()


if __name__ == "__main__":
    main()
