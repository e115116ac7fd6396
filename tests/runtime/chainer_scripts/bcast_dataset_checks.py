"""Rank script (3 ranks on 2 faked hosts, ``MNIFY_TEST_HOSTS=0,0,1``): ``bcast_dataset`` gives every
rank rank 0's dataset, and array datasets are one shared, read-only file per host.

Which file backs a rank's arrays is read from ``/proc/self/maps`` (the file is unlinked once
mapped, so it shows as ``(deleted)``): ranks 0 and 1 (host 0) must map the same file, rank 2
(host 1) another, and none may remain in ``/dev/shm``.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import chainer
import numpy as np

from mnify.runtime.datasets import bcast_dataset
from tests.support.rank_checks import make_comm, passed

comm = make_comm()
rank = comm.rank
assert comm.size == 3 and comm.inter_size == 2, (comm.size, comm.inter_size)


def mapped_files(array: np.ndarray) -> set[str]:
    """The files mapped at ``array``'s address in this process."""
    address = array.__array_interface__["data"][0]
    found = set()
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high and len(fields) == 6:
                found.add(fields[5].strip())
    return found


rng = np.random.RandomState(3)
x, t = rng.randn(1000, 7).astype(np.float32), rng.randint(0, 5, 1000).astype(np.int32)
made: Any = chainer.datasets.TupleDataset(x, t) if rank == 0 else None
data = bcast_dataset(made, comm)
assert isinstance(data, chainer.datasets.TupleDataset) and len(data) == 1000
got_x, got_t = data._datasets
assert np.array_equal(got_x, x) and np.array_equal(got_t, t) and got_x.dtype == np.float32
assert not got_x.flags.writeable and not got_t.flags.writeable
assert data[5][1] == t[5]
files = {f.removesuffix(" (deleted)") for f in mapped_files(got_x)}
assert len(files) == 1 and "mnify-dataset-" in next(iter(files)), files
assert {f.removesuffix(" (deleted)") for f in mapped_files(got_t)} == files  # one file
everyone = comm.allgather_obj(sorted(files))
assert everyone[0] == everyone[1] != everyone[2], everyone
comm.barrier()  # every host's leader has unlinked its file by now
assert all(f.endswith(" (deleted)") for f in mapped_files(got_x)), mapped_files(got_x)
left = glob.glob("/dev/shm/mnify-dataset-*") + glob.glob("/tmp/mnify-dataset-*")
assert not [f for f in left if str(os.getpid()) in f], left
passed("a TupleDataset of arrays: rank 0's, read-only, one file per host", comm)

array = bcast_dataset(np.arange(24.0).reshape(6, 4) if rank == 0 else None, comm)
assert isinstance(array, np.ndarray) and np.array_equal(array, np.arange(24.0).reshape(6, 4))
assert mapped_files(array) and "mnify-dataset-" in next(iter(mapped_files(array)))
passed("one array", comm)

objects = bcast_dataset([{"a": i} for i in range(5)] if rank == 0 else None, comm)
assert objects == [{"a": i} for i in range(5)]
passed("any other dataset: the pickle broadcast", comm)
