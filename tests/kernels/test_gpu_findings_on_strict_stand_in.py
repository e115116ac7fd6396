"""The GPU path's stream, memory, device and NCCL-order findings, each shown on CPU.

The CuPy stand-in (tests/support/fakecupy/cupy/__init__.py) queues work on streams, runs
it only when the host waits, and hands a freed block to the next allocation of its stream at
once -- so a race a GPU shows only sometimes is a wrong result here every time. Each test is
a rank script on the public path (``create_communicator("pure_nccl")``, the kernel API, the
overlap scheduler) and asserts the property: the values, the device, no host waits, one NCCL
order. Where ``mnify_fake_device`` is not imported, mnify's real CUDA kernel module runs and
the stand-in emulates its pack kernel from the raw-pointer tables.
"""

from __future__ import annotations

import pytest

from tests.support import fakecupy
from tests.support.mpirun import run_ranks

HEAD = f"""
import sys
sys.path.insert(0, {str(fakecupy.PATH)!r})
import numpy as np
import cupy
assert cupy.STRICT, "these checks need the strict stand-in"
from mnify.runtime.communicators import create_communicator


class P:
    def __init__(self, data, grad):
        self.data, self.grad = data, grad


class M:
    def __init__(self, params):
        self.params = params

    def namedparams(self):
        return iter(self.params.items())
"""


def _run(ranks: int, body: str, env: dict[str, str] | None = None) -> None:
    run = run_ranks(ranks, HEAD + body, timeout=150, env=env, check=False)
    assert not run.timed_out and run.returncode == 0, run.describe()
    for r in range(ranks):
        assert "PASS" in run.rank_lines(r), run.describe()


STRIDED_ON_SIDE_STREAM = """
import mnify_fake_device  # kernels -> queued numpy twins
comm = create_communicator("pure_nccl")
r, n = comm.rank, comm.size
base = np.arange(12, dtype=np.float32).reshape(3, 4)
wide = cupy.asarray(np.stack([base * (r + 1)] * 2, axis=-1))
model = M({"w": P(cupy.zeros((3, 4), np.float32), wide[..., 0])})  # a strided gradient
side = cupy.cuda.Stream(non_blocking=True)
comm.multi_node_mean_grad(model, stream=side)
# the caller's next work on its own stream: an array of the same size, filled
junk = cupy.full((3, 4), np.nan, np.float32)
cupy.cuda.get_current_stream().synchronize()
side.synchronize()
got = cupy.asnumpy(wide[..., 0])
want = base * sum(range(1, n + 1)) / n
assert np.allclose(got, want), f"strided mean on a side stream: {got.tolist()} != {want.tolist()}"
print("PASS", flush=True)
"""


@pytest.mark.parametrize("free_check", ["wrong-result", "use-after-free-refused"])
def test_strided_gradient_on_a_side_stream_survives_the_callers_next_allocation(
    free_check: str,
) -> None:
    """pure_nccl's contiguous copy of a strided gradient lives in the arena of the stream that
    reads it: the caller's next allocation cannot take its memory while the side stream still
    reduces and writes it back. Without the stand-in's use-after-free check the race is a
    wrong result (NaN); with it, the work on freed memory is refused."""
    env = {"FAKE_CUPY_FREE_CHECK": "0" if free_check == "wrong-result" else "1"}
    _run(2, STRIDED_ON_SIDE_STREAM, env=env)


STAGING_EVICTED = """
import mnify_fake_device
comm = create_communicator("pure_nccl")
r, n = comm.rank, comm.size
side = cupy.cuda.Stream(non_blocking=True)
models, wants = [], []
# nine layouts, one after another on the side stream, nothing waited for: the plan cache keeps
# eight, so the first layout's staging buffer is dropped while the side stream still uses it
for k in range(9):
    size = 1000 if k == 0 else 10 + k
    host = [np.full(size, r + 1.0 + k, np.float32), np.full(size + 1, 2.0 * r + k, np.float32)]
    model = M({"a": P(cupy.zeros(size, np.float32), cupy.asarray(host[0])),
               "b": P(cupy.zeros(size + 1, np.float32), cupy.asarray(host[1]))})
    comm.multi_node_mean_grad(model, stream=side)
    models.append(model)
    wants.append([sum(q + 1.0 + k for q in range(n)) / n, sum(2.0 * q + k for q in range(n)) / n])
junk = cupy.full(2001, np.nan, np.float32)  # the caller's next allocation of that size
cupy.cuda.get_current_stream().synchronize()
side.synchronize()
for k, (model, want) in enumerate(zip(models, wants)):
    got = [float(cupy.asnumpy(model.params[x].grad).max()) for x in "ab"]
    assert np.allclose(got, want), f"layout {k}: {got} != {want}"
print("PASS", flush=True)
"""


def test_staging_buffer_of_a_side_stream_outlives_its_plan() -> None:
    """Staging buffers are allocated under the stream that packs and reduces in them, so a plan
    dropped from the cache returns its buffer to that stream's arena, in that stream's order."""
    _run(2, STAGING_EVICTED)


NO_HOST_WAITS = """
# no mnify_fake_device: mnify's CUDA kernel module runs, the stand-in emulates its pack kernel
comm = create_communicator("pure_nccl")
side = cupy.cuda.Stream(non_blocking=True)
keep = []
for step in range(3):
    # Chainer hands new gradient arrays every step: new addresses, new pointer tables
    grads = [cupy.asarray(np.full(5, step + 1.0, np.float32)), cupy.asarray(np.arange(3.0))]
    model = M({"a": P(cupy.zeros(5, np.float32), grads[0]),
               "b": P(cupy.zeros(3, np.float64), grads[1])})
    keep.append(model)
    before = cupy.HOST_SYNCS["count"]
    comm.multi_node_mean_grad(model, stream=side)
    waits = cupy.HOST_SYNCS["count"] - before
    assert waits == 0, f"step {step}: the host waited {waits} time(s) inside the mean"
side.synchronize()
for step, model in enumerate(keep):
    assert cupy.asnumpy(model.params["a"].grad).tolist() == [step + 1.0] * 5
    assert cupy.asnumpy(model.params["b"].grad).tolist() == [0.0, 1.0, 2.0]
# a prepared pack replayed on another stream than the one it was prepared on
from mnify.runtime import kernels
arrays = [cupy.asarray(np.full(4, 3.0, np.float32)), cupy.asarray(np.full(2, 5.0, np.float16))]
out = cupy.zeros(6, np.float32)
prepared = kernels.prepare_pack(arrays, out, 0.5)
other = cupy.cuda.Stream(non_blocking=True)
before = cupy.HOST_SYNCS["count"]
with other:
    prepared()
assert cupy.HOST_SYNCS["count"] == before, "preparing or replaying a pack waited on the host"
other.synchronize()
assert cupy.asnumpy(out).tolist() == [1.5] * 4 + [2.5] * 2, cupy.asnumpy(out)
print("PASS", flush=True)
"""


def test_new_gradient_addresses_cost_no_host_wait() -> None:
    """The pack kernel's pointer tables are uploaded on the stream that launches it (and a
    prepared launch replayed elsewhere waits on an event), so new addresses every step never
    make the host wait for the side stream."""
    _run(1, NO_HOST_WAITS)


CHANNELS_ON_THEIR_DEVICE = """
import mnify_fake_device
from mnify.runtime import kernels
counts, n, spatial = [2, 1], 2, (3,)
flat_h = np.arange(n * 3 * 3, dtype=np.float32)
with cupy.cuda.Device(1):
    flat = cupy.asarray(flat_h)
full = kernels.gather_channels(flat, counts, n, spatial)  # called with device 0 current
assert full.device.id == 1, f"gather_channels allocated on device {full.device.id}"
with cupy.cuda.Device(1):
    back = kernels.split_channels(full, counts)
    got, want = cupy.asnumpy(back), flat_h
assert back.device.id == 1 and np.array_equal(got, want), (back.device.id, got)
back0 = kernels.split_channels(full, counts)  # device 0 current again
assert back0.device.id == 1, f"split_channels allocated on device {back0.device.id}"
print("PASS", flush=True)
"""


def test_channel_kernels_allocate_on_their_arrays_device() -> None:
    """gather_channels/split_channels allocate their output on the input's device, not on
    whatever device happens to be current."""
    _run(1, CHANNELS_ON_THEIR_DEVICE)


TWO_COMMUNICATORS = """
import mnify_fake_device
from mnify.runtime.overlap import BucketScheduler, OverlapChannel
comm = create_communicator("pure_nccl")
r, n = comm.rank, comm.size
channel = OverlapChannel(comm, on_device=True)  # an NCCL communicator of its own
reducer = channel.reducer(np.dtype(np.float32))
sched = BucketScheduler([40, 30], reducer, bucket_bytes=160, own_bucket_bytes=None)
assert len(sched.buckets) == 2, sched.buckets
grads = [cupy.asarray(np.full(40, r + 1.0, np.float32)), cupy.asarray(np.full(30, 2.0 * r, np.float32))]
sched.ready(0, grads[0])  # the first bucket's mean is queued on the side stream
# inside backward, a collective on the main communicator (MultiNodeBatchNormalization's)
stats = comm.allreduce(cupy.asarray(np.array([r + 1.0], np.float32)))
sched.ready(1, grads[1])
sched.wait(lambda i: grads[i])
assert cupy.asnumpy(stats).tolist() == [sum(range(1, n + 1))], cupy.asnumpy(stats)
assert np.allclose(cupy.asnumpy(grads[0]), sum(range(1, n + 1)) / n)
assert np.allclose(cupy.asnumpy(grads[1]), sum(2.0 * q for q in range(n)) / n)
channel.close()
print("PASS", flush=True)
"""


def test_overlap_and_main_nccl_communicators_run_in_one_order() -> None:
    """The overlap scheduler's NCCL communicator and the main one never have work queued on
    two streams without an event ordering them (NCCL may deadlock otherwise)."""
    _run(2, TWO_COMMUNICATORS)


SCALED_IN_PLACE = """
# no mnify_fake_device: the real kernel module, with the stand-in's pack kernel emulation
comm = create_communicator("pure_nccl", bucket_bytes=64)
r, n = comm.rank, comm.size
assert not comm._can_average  # NCCL 2.9: the 1/size is applied before the sum
model = M({"big": P(cupy.zeros(40, np.float32), cupy.asarray(np.full(40, r + 1.0, np.float32)))})
comm.multi_node_mean_grad(model)  # 40 floats: a bucket of its own, reduced in place
got = cupy.asnumpy(model.params["big"].grad)
assert np.allclose(got, sum(range(1, n + 1)) / n), got
print("PASS", flush=True)
"""


@pytest.mark.parametrize("kernels", ["cuda-module", "numpy-twins"])
def test_in_place_bucket_is_scaled_without_aliased_restrict_pointers(kernels: str) -> None:
    """A bucket reduced in the gradient's own memory is scaled in place, not unpacked from
    itself (the pack kernel's pointers are ``__restrict__``: aliasing them is undefined)."""
    body = SCALED_IN_PLACE
    if kernels == "numpy-twins":
        body = "import mnify_fake_device\n" + body
    _run(2, body, env={"FAKE_NCCL_VERSION": "20903"})
