"""Device (CuPy) arrays through the MPI communicators, with a host-memory stand-in for CuPy.

The stand-in (tests/support/fakecupy) runs with opaque arrays: as with real CuPy, numpy cannot
read a device array, so only the communicators' explicit staging (``.get()``) reaches the host.
Checks that results come back in the caller's array module, that in-place operations write the
device arrays, that values equal the numpy reference, and that ``bcast_data`` downloads nothing
on the ranks it overwrites. Prints ``PASS <name>`` per communicator (tests/support/rank_checks).
"""

from __future__ import annotations

import sys

from tests.support import fakecupy

fakecupy.use()

import cupy  # noqa: E402
import numpy as np  # noqa: E402

from mnify.runtime.communicators import create_communicator  # noqa: E402
from tests.support.rank_checks import passed  # noqa: E402


class Param:
    def __init__(self, data: object, grad: object) -> None:
        self.data = data
        self.grad = grad


class Model:
    def __init__(self, params: dict[str, Param]) -> None:
        self.params = params

    def namedparams(self):  # type: ignore[no-untyped-def]
        return list(self.params.items())


def host(x: object) -> np.ndarray:
    assert isinstance(x, cupy.ndarray), f"expected a device array, got {type(x)}"
    return x.get()


def main(name: str) -> None:
    comm = create_communicator(name)
    r, n = comm.rank, comm.size
    total = sum(range(n))

    y = comm.allreduce(cupy.asarray(np.full((2, 3), float(r), np.float32)))
    np.testing.assert_array_equal(host(y), np.full((2, 3), total, np.float32))

    xs = [cupy.asarray(np.full(4, float(r), np.float16)), cupy.asarray(np.full(3, float(r)))]
    comm.all_reduce(xs, division=True)
    np.testing.assert_allclose(host(xs[0]), np.full(4, total / n, np.float16), rtol=1e-3)
    np.testing.assert_allclose(host(xs[1]), np.full(3, total / n))

    model = Model(
        {
            "/w": Param(cupy.asarray(np.full((3, 2), float(r), np.float32)), None),
            "/b": Param(cupy.asarray(np.zeros(2, np.float32)), None),
        }
    )
    downloads = cupy.TRANSFERS["download"]
    comm.bcast_data(model)
    if r != 0:  # overwritten anyway: nothing to download
        assert cupy.TRANSFERS["download"] == downloads, cupy.TRANSFERS
    np.testing.assert_array_equal(host(model.params["/w"].data), np.zeros((3, 2), np.float32))
    model.params["/w"].grad = cupy.asarray(np.full((3, 2), float(r + 1), np.float32))
    comm.multi_node_mean_grad(model, zero_fill=True)
    want = np.full((3, 2), sum(q + 1 for q in range(n)) / n, np.float32)
    np.testing.assert_allclose(host(model.params["/w"].grad), want)
    np.testing.assert_array_equal(host(model.params["/b"].grad), np.zeros(2, np.float32))

    parts = comm.allgather(cupy.asarray(np.full(r + 1, float(r))))
    for q, p in enumerate(parts):
        np.testing.assert_array_equal(host(p), np.full(q + 1, float(q)))
    gathered = comm.gather(cupy.asarray(np.full(2, float(r))), root=0)
    if r == 0:
        assert gathered is not None
        assert [float(host(g)[0]) for g in gathered] == [float(q) for q in range(n)]
    swapped = comm.alltoall([cupy.asarray(np.full(1, float(r * 10 + s))) for s in range(n)])
    assert [float(host(s)[0]) for s in swapped] == [float(q * 10 + r) for q in range(n)]
    b = comm.bcast(cupy.asarray(np.arange(3.0)) if r == 0 else None)
    np.testing.assert_array_equal(np.asarray(host(b) if r == 0 else b), np.arange(3.0))
    comm.finalize()
    passed(name)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        main(arg)
