"""Rank script: scatter_dataset of CuPy-backed datasets, with CuPy stood in on CPU ranks.

tests/support/fakecupy's arrays live in host memory but have CuPy's type, so the path taken is
the device one: each rank's share travels as host rows and arrives as a (stand-in) CuPy array.
"""

from __future__ import annotations

from tests.support import fakecupy

fakecupy.use()

import chainer  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402

from mnify.runtime.datasets.scatter_dataset import scatter_dataset, split_ranges  # noqa: E402
from tests.support.rank_checks import make_comm, passed  # noqa: E402

comm = make_comm()
rank, size = comm.rank, comm.size

n = 11
x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
y = np.arange(n, dtype=np.int32)
full = chainer.datasets.TupleDataset(cupy.asarray(x), y) if rank == 0 else None
share = scatter_dataset(full, comm, shuffle=True, seed=3)
order = np.random.RandomState(3).permutation(n)
begin, end = split_ranges(n, size)[rank]
device_part, host_part = share._datasets
assert type(device_part).__module__ == "cupy", type(device_part)
assert isinstance(host_part, np.ndarray) and type(host_part).__module__ == "numpy"
assert np.array_equal(cupy.asnumpy(device_part), x[order[begin:end]])
assert np.array_equal(host_part, y[order[begin:end]])
passed("CuPy arrays arrive as CuPy arrays holding only the share", comm)
