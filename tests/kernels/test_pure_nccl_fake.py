"""pure_nccl's logic under real MPI ranks on CPU, with NCCL and CuPy stood in by tests/support/fakecupy.

The fake performs each NCCL call pure_nccl makes (raw device pointers, element counts, NCCL
dtypes, in-place buffers) with MPI on the memory behind those pointers, and the CUDA kernels are
replaced by their numpy twins. What is checked is everything above the library: the lazy
communicator with its MPI-broadcast unique id (in CuPy 14's bytes and CuPy 13's tuple form),
the device each rank picks and selects (every GPU visible, or one per rank through
CUDA_VISIBLE_DEVICES), bucket packing with the 1/size scale (ncclAvg where NCCL has it) and the
fp16 wire dtype, strided gradients copied on the side stream after its wait, padding for uneven
allgathers, the root-decides header of bcast, in-place bcast_data, the fallbacks to the MPI
path, the watchdog wait, and finalize. Each rank reports ``PASS <check>``
(tests/support/rank_checks) and every rank must pass rank 0's list, in order. Real GPUs: see
tests/gpu and scripts/gpu_check.sh.
"""

from __future__ import annotations

import pytest

from tests.support import fakecupy
from tests.support.mpirun import run_ranks

FAKE = fakecupy.PATH

SCRIPT = r"""
import sys
sys.path.insert(0, FAKE)
import numpy as np
import cupy
# the CUDA kernels -> their numpy twins (the fake "device" arrays are numpy underneath)
import mnify_fake_device

from mnify.runtime.communicators import create_communicator
from mnify.runtime.communicators.pure_nccl import PureNcclCommunicator, nccl_status
from tests.support.rank_checks import passed

calls = cupy.cuda.nccl.NcclCommunicator.calls

def host(x):  # a result on the host: CuPy arrays only through asnumpy (they are opaque)
    return cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else np.asarray(x)

def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name} failed on rank {comm.rank}: {detail}")
    passed(name)

assert nccl_status()[0], nccl_status()
comm = create_communicator("pure_nccl")
r, n = comm.rank, comm.size
check("identity", isinstance(comm, PureNcclCommunicator) and comm.device_id == comm.intra_rank)
check("device selected", cupy.cuda.Device().id == comm.device_id)
check("lazy", calls == [], calls)
avg = cupy.cuda.nccl.get_version() >= 21000
mean_op = ":avg" if avg else ""
print("CUPY", cupy.__version__.split(".")[0], "ncclAvg", avg)

class P:
    def __init__(self, data, grad):
        self.data, self.grad = data, grad

class M:
    def __init__(self, params):
        self.params = params
    def namedparams(self):
        return iter(self.params.items())

def grads_of(rank, dtype=np.float32):
    rng = np.random.default_rng(rank)
    shapes = {"z/W": (5, 3, 3, 3), "a/b": (7,), "m/g": (2, 11), "q/e": (0,)}
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}

def model_of(rank, dtype=np.float32):
    return M({k: P(cupy.asarray(v * 0 + rank), cupy.asarray(v)) for k, v in grads_of(rank, dtype).items()})

# -- multi_node_mean_grad: one packed float32 bucket, 1/size fused
model = model_of(r)
comm.multi_node_mean_grad(model)
check("nccl created once, on this rank's device", calls[:1] == [f"init:dev{r}"], calls)
expect = {k: np.mean([grads_of(q)[k] for q in range(n)], axis=0) for k in model.params}
for k, p in model.params.items():
    check(f"mean_grad {k}", isinstance(p.grad, cupy.ndarray) and np.allclose(cupy.asnumpy(p.grad), expect[k], rtol=1e-6, atol=1e-6))
total = sum(v.size for v in grads_of(0).values())
check("one bucket one allreduce", calls[1:] == [f"allReduce:7:{total}{mean_op}"], calls)

# zero_fill: a missing grad becomes zeros on every rank and is reduced with the rest
model = model_of(r)
model.params["a/b"].grad = None
zf = cupy.cuda.Stream(non_blocking=True)
comm.multi_node_mean_grad(model, zero_fill=True, stream=zf)
zf.synchronize()  # before the gradients are read (or dropped): the stream reduces them
check("zero_fill", np.array_equal(cupy.asnumpy(model.params["a/b"].grad), np.zeros(7, np.float32)))

# a strided gradient on a side stream: the side stream first waits on an event of the current
# stream (where the gradient was written), then makes the contiguous copy itself -- in its own
# memory arena, so the copy cannot be handed to the caller's next allocation while in use
model = model_of(r)
wide = cupy.asarray(np.stack([grads_of(r)["m/g"]] * 2, axis=-1))
model.params["m/g"].grad = wide[..., 0]
side = cupy.cuda.Stream(non_blocking=True)
cupy.timeline.clear()
comm.multi_node_mean_grad(model, stream=side)
line = cupy.timeline
current = cupy.cuda.get_current_stream().ptr
wait_at = line.index(f"wait:{side.ptr}")
copy_at = line.index(f"copy:{side.ptr}")
check("strided copy on the side stream after its wait", line[wait_at - 1] == f"record:{current}" and wait_at < copy_at and f"copy:{current}" not in line, line)
side.synchronize()  # the caller's part: wait for the stream it asked for
check("strided mean", np.allclose(cupy.asnumpy(wide[..., 0]), expect["m/g"], rtol=1e-6, atol=1e-6))

# a stream made under another device is refused with both devices named
with cupy.cuda.Device((comm.device_id + 1) % 4):
    elsewhere = cupy.cuda.Stream(non_blocking=True)
try:
    comm.multi_node_mean_grad(model_of(r), stream=elsewhere)
except ValueError as exc:
    check("foreign stream refused", f"runs on device {comm.device_id}" in str(exc), exc)
else:
    raise AssertionError("a stream of another device was accepted")

# -- all_reduce over a list, in place, with division; non-contiguous and mixed dtypes
base = cupy.asarray(np.arange(24, dtype=np.float64).reshape(4, 6) * (r + 1))
arrays = [cupy.full((3,), float(r), np.float32), base[:, ::2], cupy.asarray(np.full(5, r + 1, np.float16))]
comm.all_reduce(arrays, division=True)
tri = sum(range(1, n + 1))
check("all_reduce f32", np.allclose(cupy.asnumpy(arrays[0]), sum(range(n)) / n))
check("all_reduce strided", np.allclose(cupy.asnumpy(base[:, ::2]), np.arange(24.0).reshape(4, 6)[:, ::2] * tri / n))
check("all_reduce f16", np.allclose(cupy.asnumpy(arrays[2]), tri / n, rtol=1e-3))
check("all_reduce wire is the widest dtype", calls[-1].startswith("allReduce:8:"), calls[-1])

# -- allreduce: new array, every op, and a dtype NCCL lacks (int16) through MPI
x = cupy.asarray(np.array([r, -r, 2], dtype=np.int32))
for op, ref in (("sum", [sum(range(n)), -sum(range(n)), 2 * n]), ("max", [n - 1, 0, 2]), ("min", [0, -(n - 1), 2]), ("prod", [0, 0, 2 ** n])):
    y = comm.allreduce(x, op)
    check(f"allreduce {op}", isinstance(y, cupy.ndarray) and cupy.asnumpy(y).tolist() == ref and y.data.ptr != x.data.ptr, cupy.asnumpy(y))
before = len(calls)
b = comm.allreduce(cupy.asarray(np.array([r, 1], dtype=np.int16)), "max")
check("allreduce int16 via MPI", isinstance(b, cupy.ndarray) and cupy.asnumpy(b).tolist() == [n - 1, 1] and len(calls) == before)

# -- bcast: root decides; non-roots pass None and still get a device array
root = n - 1
got = comm.bcast(cupy.asarray(np.arange(6, dtype=np.float16).reshape(2, 3) + r) if r == root else None, root=root)
check("bcast device", isinstance(got, cupy.ndarray) and got.shape == (2, 3) and got.dtype == np.float16 and np.array_equal(cupy.asnumpy(got), np.arange(6).reshape(2, 3) + root))
check("bcast as bytes", calls[-1] == "bcast:1:12", calls[-1])
host_got = comm.bcast(np.arange(3) * 7 if r == 0 else None)
check("bcast host fallback", not isinstance(host_got, cupy.ndarray) and host_got.tolist() == [0, 7, 14])

# -- bcast_data: in place, same buffers
model = model_of(r)
ptrs = {k: p.data.data.ptr for k, p in model.params.items()}
comm.bcast_data(model)
check("bcast_data", all(p.data.data.ptr == ptrs[k] and np.all(cupy.asnumpy(p.data) == 0) for k, p in model.params.items()))

# -- allgather: uneven shapes are padded to the largest block, then trimmed
mine = cupy.asarray(np.full((r + 1, 2), r, dtype=np.float32))
parts = comm.allgather(mine)
check("allgather uneven", [p.shape for p in parts] == [(q + 1, 2) for q in range(n)] and all(np.all(cupy.asnumpy(p) == q) for q, p in enumerate(parts)))
check("allgather padded bytes", calls[-1] == f"allGather:1:{n * 2 * 4}", calls[-1])
mixed = comm.allgather(mine if r == 0 else cupy.asnumpy(mine))
check("allgather mixed modules via MPI", [host(p).shape for p in mixed] == [(q + 1, 2) for q in range(n)])
g = comm.gather(mine, root=0)
check("gather via MPI", (g is None) == (r != 0))

# -- alltoall: uneven shapes per destination, one NCCL group of sends and receives
outgoing = [cupy.asarray(np.full((r + 1, d + 1), 10 * r + d, dtype=np.float32)) for d in range(n)]
incoming = comm.alltoall(outgoing)
check("alltoall device", all(isinstance(a, cupy.ndarray) and a.shape == (q + 1, r + 1) and np.all(cupy.asnumpy(a) == 10 * q + r) for q, a in enumerate(incoming)))
check("alltoall over send/recv", sum(c.startswith("send:1:") for c in calls) == n - 1 and sum(c.startswith("recv:1:") for c in calls) == n - 1, calls)
mixed = comm.alltoall([cupy.asnumpy(o) for o in outgoing] if r == 0 else outgoing)
check("alltoall mixed via MPI", [host(a).tolist() for a in mixed] == [host(a).tolist() for a in incoming])

# -- fp16 transport: scaled before the sum, within float16 tolerance
c16 = create_communicator("pure_nccl", allreduce_grad_dtype=np.float16)
model = model_of(r)
c16.multi_node_mean_grad(model)
for k, p in model.params.items():
    check(f"fp16 {k}", p.grad.dtype == np.float32 and np.allclose(cupy.asnumpy(p.grad), expect[k], rtol=2e-3, atol=2e-3))
check("fp16 wire, scale fused into packing", calls[-1] == f"allReduce:6:{total}", calls[-1])
c16.finalize()

# -- explicit bucket_bytes: arrays split across several buckets
cb = create_communicator("pure_nccl", bucket_bytes=64)
model = model_of(r)
cb.multi_node_mean_grad(model)
for k, p in model.params.items():
    check(f"buckets {k}", np.allclose(cupy.asnumpy(p.grad), expect[k], rtol=1e-6, atol=1e-6))
# the host's planner: 22 and 135 floats (at least half a bucket) in buckets of their own,
# split evenly (11+11, 9 x 15), reduced in place; the 7 floats packed alone; 0 skipped
sizes = [int(c.split(":")[2]) for c in calls if c.startswith("allReduce:7:")][-12:]
check("buckets of at most 16 floats", sizes == [11, 11] + [15] * 9 + [7], sizes)
cb.finalize()

comm.finalize()
check("finalize destroys", calls.count("destroy") == 3, calls)
"""


@pytest.mark.parametrize(
    ("ranks", "cupy_version", "nccl_version"),
    [(2, "14.2.0", "22304"), (3, "13.6.0", "20903")],
    ids=["cupy14-nccl2.23-debug-watchdog", "cupy13-nccl2.9"],
)
def test_pure_nccl_logic_on_fake_devices(ranks: int, cupy_version: str, nccl_version: str) -> None:
    env = {"FAKE_CUPY_VERSION": cupy_version, "FAKE_NCCL_VERSION": nccl_version}
    if ranks == 2:
        env |= {"MNIFY_WATCHDOG_TIMEOUT": "60", "MNIFY_DEBUG": "1"}
    run = run_ranks(ranks, f"FAKE = {str(FAKE)!r}\n" + SCRIPT, timeout=180, env=env)
    expected = [line for line in run.rank_lines(0) if line.startswith("PASS ")]
    assert len(expected) > 30, run.output
    major, avg = cupy_version.split(".")[0], int(nccl_version) >= 21000
    assert f"CUPY {major} ncclAvg {avg}" in run.rank_lines(0), run.output
    for r in range(1, ranks):
        assert [ln for ln in run.rank_lines(r) if ln.startswith("PASS ")] == expected, run.output


ISOLATED = r"""
import os, sys
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
# what CUDA_VISIBLE_DEVICES=<rank> gives each rank: one GPU, numbered 0, a bus of its own
# (unless SAME_GPU: every rank sees the same single GPU)
os.environ["FAKE_CUPY_DEVICES"] = "1"
os.environ["FAKE_CUPY_FIRST_BUS"] = "0" if os.environ.get("SAME_GPU") else str(rank)
sys.path.insert(0, FAKE)
import numpy as np
import cupy
import mnify_fake_device  # the CUDA kernels -> their numpy twins
from mnify.runtime.communicators import create_communicator

try:
    comm = create_communicator("pure_nccl")
except RuntimeError as exc:
    print("REFUSED", exc, flush=True)
    raise SystemExit(0)
assert comm.device_id == 0 and comm.intra_rank == rank, (comm.device_id, comm.intra_rank)
x = comm.allreduce(cupy.asarray(np.full(3, rank + 1.0, np.float32)))
assert cupy.asnumpy(x).tolist() == [sum(range(1, comm.size + 1))] * 3
assert cupy.cuda.nccl.NcclCommunicator.calls[0] == "init:dev0"
print("ISOLATED OK", comm.device_id, flush=True)
comm.finalize()
"""


def test_ranks_isolated_by_cuda_visible_devices_each_use_device_0() -> None:
    run = run_ranks(2, f"FAKE = {str(FAKE)!r}\n" + ISOLATED, timeout=120)
    for r in range(2):
        assert run.rank_lines(r) == ["ISOLATED OK 0"], run.output


def test_two_ranks_on_one_gpu_are_refused_on_every_rank() -> None:
    run = run_ranks(2, f"FAKE = {str(FAKE)!r}\n" + ISOLATED, timeout=120, env={"SAME_GPU": "1"})
    for r in range(2):
        (line,) = run.rank_lines(r)
        assert line.startswith("REFUSED pure_nccl: ranks [0, 1]"), run.output
        assert "CUDA_VISIBLE_DEVICES" in line, run.output


HANG = r"""
import sys, time
sys.path.insert(0, FAKE)
import numpy as np
import cupy
import mnify_fake_device  # the CUDA kernels -> their numpy twins
from mnify.runtime.communicators import create_communicator

class P:
    def __init__(self, g):
        self.data, self.grad = g.copy(), g

class M:
    def namedparams(self):
        return iter([("w", P(cupy.ones(1000, np.float32)))])

comm = create_communicator("pure_nccl")
comm.multi_node_mean_grad(M())
print("first average done", flush=True)
if comm.rank == 1:
    time.sleep(60)  # never joins the second average
    print("rank 1 woke up", flush=True)
else:
    comm.multi_node_mean_grad(M())
    print("rank 0 returned", flush=True)
"""


def test_watchdog_names_the_rank_that_never_queued_its_nccl_call() -> None:
    # NCCL calls return at once and the GPU waits; the stand-in queues each call on its
    # stream likewise, so only pure_nccl's own wait (under the watchdog) can notice.
    env = {"MNIFY_WATCHDOG_TIMEOUT": "2"}
    run = run_ranks(2, f"FAKE = {str(FAKE)!r}\n" + HANG, timeout=90, env=env, check=False)
    assert not run.timed_out and run.returncode != 0, run.output
    assert run.output.count("first average done") == 2, run.output
    assert "collective multi_node_mean_grad" in run.output, run.output
    assert "timed out after 2 s on rank 0: rank(s) 1 never arrived" in run.output, run.output
    assert "rank 0 returned" not in run.output and "rank 1 woke up" not in run.output
