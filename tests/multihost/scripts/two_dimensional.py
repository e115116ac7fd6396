"""Rank script: the ``two_dimensional`` communicator's gradient mean on ranks spread over real hosts.

For several bucket sizes (arrays spanning many buckets, packed and in-place buckets), windows
(how many buckets cross the link at once) and dtypes, each rank averages known per-rank
gradients twice in a row (the staging slots are reused) and checks:

- the mean equals a float64 reference every rank computes from the known inputs;
- every rank, on every host, holds the same bits;
- ``all_reduce`` (a sum, no 1/size) likewise.

Prints ``RESULT {json}`` (whether the pipelined path ran, what ``auto`` picked) and
``PASS two_dimensional``; a failing check raises (the failure hook then ends the job).
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from mnify import runtime as mn

# odd sizes straddle bucket and share boundaries; (300_000,) is reduced in its own memory
SHAPES = [(3, 5), (7,), (2, 3, 4), (1000,), (64, 33), (300_000,), (1,), (17, 19)]
TOLERANCE = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}
ALL = (np.float32, np.float64, np.float16)
# (bucket_bytes, window, dtypes): the defaults; one bucket crossing at a time; many small buckets
# (4 KiB: the 300_000-float array alone spans ~290) with a window smaller than the bucket count
CONFIGS = [
    (None, None, ALL),
    (None, 1, (np.float32,)),
    (4096, 3, ALL),
    (4096, None, (np.float32,)),
    (64 << 10, 2, (np.float16,)),
]


class Param:
    def __init__(self, data: np.ndarray, grad: np.ndarray) -> None:
        self.data = data
        self.grad = grad


class Model:
    def __init__(self, grads: list[np.ndarray]) -> None:
        self.params = {f"p{i}": Param(np.zeros_like(g), g) for i, g in enumerate(grads)}

    def namedparams(self) -> list[tuple[str, Param]]:
        return list(self.params.items())


def grads_of(rank: int, dtype: type, salt: int) -> list[np.ndarray]:
    rng = np.random.RandomState(1000 + 17 * rank + salt)
    grads = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    grads[4] = np.asfortranarray(grads[4])  # a non-contiguous gradient: copied and written back
    return grads


def same_bits(what: str, x: np.ndarray) -> None:
    digests = MPI.COMM_WORLD.allgather(np.ascontiguousarray(x).tobytes())
    if any(d != digests[0] for d in digests):
        raise AssertionError(f"{what}: ranks disagree bit for bit")


def main() -> None:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    columns = []
    for bucket_bytes, window, dtypes in CONFIGS:
        comm = mn.create_communicator("two_dimensional", bucket_bytes=bucket_bytes)
        if window is not None:
            comm.window = window  # type: ignore[attr-defined]
        columns.append(bool(comm._columns))  # type: ignore[attr-defined]
        for dtype in dtypes:
            tol = TOLERANCE[dtype]
            for salt in range(2):
                every = [grads_of(q, dtype, salt) for q in range(size)]
                mean = [
                    np.mean([g[i].astype(np.float64) for g in every], axis=0)
                    for i in range(len(SHAPES))
                ]
                model = Model(grads_of(rank, dtype, salt))
                comm.multi_node_mean_grad(model)
                what = f"bucket_bytes={bucket_bytes} window={window} {np.dtype(dtype)} #{salt}"
                for i, param in enumerate(model.params.values()):
                    assert param.grad.dtype == dtype, (what, i, param.grad.dtype)
                    np.testing.assert_allclose(
                        param.grad, mean[i], rtol=tol, atol=tol, err_msg=f"{what} p{i}"
                    )
                    same_bits(f"{what} p{i}", param.grad)
                summed = grads_of(rank, dtype, salt)[3:6]
                comm.all_reduce(summed)
                for j, s in enumerate(summed):
                    np.testing.assert_allclose(
                        s, mean[3 + j] * size, rtol=tol, atol=tol * size, err_msg=what
                    )
                    same_bits(f"{what} all_reduce {j}", s)
        comm.finalize()
    auto = mn.create_communicator("auto")
    result = {"rank": rank, "columns": columns, "auto": auto.name}
    auto.finalize()
    print("RESULT " + json.dumps(result), flush=True)
    print("PASS two_dimensional", flush=True)


if __name__ == "__main__":
    main()
