"""The overlap scheduler's NCCL reducer under real MPI ranks, CuPy and NCCL stood in.

tests/support/fakecupy performs each NCCL call with MPI on the memory behind the pointers, so
what is checked is everything above the library: an NCCL communicator of the scheduler's own
(not the communicator's), the mean's values (ncclAvg where NCCL has it, the scale fused into
packing where not), the side stream waiting on an event of the compute stream before each
bucket and the compute stream waiting for the side stream at ``wait``, strided gradients written
back, and gradients never handed over zero-filled by the caller. Real GPUs: bench/overlap_gpu.py
in scripts/gpu_check.sh.
"""

from __future__ import annotations

import pytest

from tests.support import fakecupy
from tests.support.mpirun import run_ranks

SCRIPT = r"""
import sys
sys.path.insert(0, FAKE)
import numpy as np
import cupy
import mnify_fake_device  # the CUDA kernels -> their numpy twins

from mnify.runtime.communicators import create_communicator
from mnify.runtime.overlap import BucketScheduler, NcclMeanReducer, OverlapChannel

comm = create_communicator("pure_nccl")
r, n = comm.rank, comm.size
calls = cupy.cuda.nccl.NcclCommunicator.calls
channel = OverlapChannel(comm, on_device=True)
assert channel.nccl_comm is not None and comm._nccl_comm is None, "a communicator of its own"
reducer = channel.reducer(np.dtype(np.float32))
assert isinstance(reducer, NcclMeanReducer)
avg = cupy.cuda.nccl.get_version() >= 21000
assert reducer.scale_before == (1.0 if avg else 1.0 / n), reducer.scale_before

shapes = [(40,), (3, 5), (100,), (7,), (6, 4)]
sched = BucketScheduler([int(np.prod(s)) for s in shapes], reducer, bucket_bytes=256,
                        own_bucket_bytes=None)
assert len(sched.buckets) >= 3, sched.buckets
rng = np.random.RandomState(r)
host = [rng.randn(*s).astype(np.float32) for s in shapes]
everyone = comm.allgather_obj(host)
want = [sum(h[i] for h in everyone) / n for i in range(len(shapes))]
grads = [cupy.asarray(h) for h in host]
strided_base = cupy.asarray(np.zeros((6, 8), np.float32))
strided = strided_base[:, ::2]
strided[...] = grads[4]
grads[4] = strided
want[3] = np.zeros(7, np.float32)  # never handed over: filled with zeros by the caller

for step in range(2):
    for g, h in zip(grads, host):
        g[...] = cupy.asarray(h)
    before = len(cupy.timeline)
    for i in (0, 1, 2, 4):
        sched.ready(i, grads[i])
    started = sched.started
    def fill(i):
        grads[i].fill(0)
        return grads[i]

    sched.wait(fill)
    events = cupy.timeline[before:]
    side = reducer.stream.ptr
    assert f"wait:{side}" in events, events
    assert events[-1] == f"wait:{cupy.cuda.get_current_stream().ptr}", events
    for i, g in enumerate(grads):
        got = np.asarray(g.get() if hasattr(g, "get") else g)
        np.testing.assert_allclose(got, want[i], rtol=1e-6, atol=1e-7, err_msg=str(i))
    assert started >= 1, started  # the buckets before the unused array's started early
reduced = [c for c in calls if c.startswith("allReduce")]
assert reduced and all(c.endswith(":avg") == avg for c in reduced), reduced
channel.close()
print("PASS overlap nccl reducer", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("nccl_version", ["22304", "20903"])
def test_nccl_reducer_on_fake_devices(nccl_version: str) -> None:
    run = run_ranks(
        2,
        f"FAKE = {str(fakecupy.PATH)!r}\n" + SCRIPT,
        timeout=120,
        env={"FAKE_NCCL_VERSION": nccl_version},
    )
    for rank in range(2):
        assert "PASS overlap nccl reducer" in run.rank_lines(rank), run.describe()
