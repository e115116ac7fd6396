"""Every collective of the communicator contract against numpy references, on each rank.

Usage: ``collectives.py NAME[/MODE+MODE] ...`` (communicator names; modes ``small`` (or
``MNIFY_SMALL_BUCKETS=1``): 64-byte buckets, so arrays span several buckets; ``mpi``: no
shared-memory means; ``tinyshm``: a 4 KiB shared-memory budget). Output lines are tagged ``NAME/MODES`` with the modes sorted. Per-rank inputs are known
functions of the rank, so each rank computes what every collective must return. Prints
``PASS <name> <check>`` per check and ``PASS <name>`` at the end (tests/support/rank_checks), and
``CLASS``/``SHM`` lines the test reads; any failure raises (the failure hook then ends the job).
"""

from __future__ import annotations

import os
import sys

from tests.support.rank_checks import assert_close, fake_hosts, passed

# before anything reads the host name (MNIFY_TEST_HOSTS="0,0,1,1": two hosts of two ranks)
fake_hosts()

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mnify.runtime.communicators import create_communicator, shared_memory  # noqa: E402

DTYPES = (np.float16, np.float32, np.float64)


class Param:
    def __init__(self, data: np.ndarray | None, grad: np.ndarray | None) -> None:
        self.data = data
        self.grad = grad


class FakeModel:
    """Anything with ``namedparams()``, as the contract says (a Chainer Link has it)."""

    def __init__(self, params: dict[str, Param]) -> None:
        self.params = params

    def namedparams(self):  # type: ignore[no-untyped-def]
        # deliberately not sorted: communicators must order by name themselves
        return list(reversed(list(self.params.items())))


def value(rank: int, shape: tuple[int, ...], dtype: type, salt: int = 0) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    base = (np.arange(n) % 13 - 6 + rank * 3 + salt).astype(np.float64) / 4
    return base.reshape(shape).astype(dtype)


def close(what: str, got: np.ndarray, want: np.ndarray, tol: float | None = None) -> None:
    """``assert_close`` with the dtype kept (a collective returns the dtype it was given) and a
    tolerance for the dtype (float16: 1e-2)."""
    if tol is None:
        tol = 1e-2 if np.dtype(want.dtype) == np.float16 else 1e-6
    assert_close(what, got, want, rtol=tol, atol=tol, same_dtype=True)


def check(name: str, modes: set[str]) -> None:
    small_buckets = "small" in modes
    # "tinyshm": a 4 KiB shared-memory budget, so slots are smaller than buckets
    shared_memory.SEGMENT_BUDGET = 4096 if "tinyshm" in modes else (32 << 20)
    comm = create_communicator(name, bucket_bytes=64 if small_buckets else None)
    r, n = comm.rank, comm.size
    tag = f"{name}/{'+'.join(sorted(modes))}" if modes else name

    def ok(what: str) -> None:
        passed(f"{tag} {what}")

    print(f"CLASS {tag} {comm.name}", flush=True)

    # topology against the host names every rank reports
    names = comm.allgather_obj(comm.host_name)
    hosts = list(dict.fromkeys(names))
    same = [q for q in range(n) if names[q] == comm.host_name]
    assert (comm.intra_rank, comm.intra_size) == (same.index(r), len(same)), names
    assert (comm.inter_rank, comm.inter_size) == (hosts.index(comm.host_name), len(hosts)), names
    ok("topology")

    for dtype in DTYPES:
        shape = (4, 3)
        want = sum(value(q, shape, np.float64) for q in range(n)).astype(dtype)
        close(f"allreduce sum {dtype}", comm.allreduce(value(r, shape, dtype)), want)
        want_max = np.max([value(q, shape, dtype) for q in range(n)], axis=0)
        close(f"allreduce max {dtype}", comm.allreduce(value(r, shape, dtype), op="max"), want_max)
        want_min = np.min([value(q, shape, dtype) for q in range(n)], axis=0)
        close(f"allreduce min {dtype}", comm.allreduce(value(r, shape, dtype), op="min"), want_min)
    big = value(r, (1000,), np.float32)  # larger than a small bucket: reduced in pieces
    close(
        "allreduce chunked",
        comm.allreduce(big),
        sum(value(q, (1000,), np.float64) for q in range(n)).astype(np.float32),
    )
    prod = comm.allreduce(np.array([r + 1.0, 2.0]), op="prod")
    close("allreduce prod", prod, np.array([float(np.prod(np.arange(1, n + 1))), 2.0**n]))
    ok("allreduce")

    for division in (False, True):
        shapes = [(3, 2), (7,), (2, 2, 5), ()]
        dtypes = [np.float32, np.float64, np.float16, np.float32]
        xs = [value(r, s, d, i) for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))]
        comm.all_reduce(xs, division=division)
        for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True)):
            want = sum(value(q, s, np.float64, i) for q in range(n))
            if division:
                want = want / n
            close(f"all_reduce[{i}] division={division}", xs[i], want.astype(d))
    ok("all_reduce")

    for dtype in DTYPES:
        shape = (2 + r, 3)  # uneven on purpose
        xs = comm.gather(value(r, shape, dtype), root=n - 1)
        if r == n - 1:
            assert xs is not None and len(xs) == n
            for q, x in enumerate(xs):
                close(f"gather from {q}", x, value(q, (2 + q, 3), dtype))
        else:
            assert xs is None
        ys = comm.allgather(value(r, shape, dtype))
        for q, y in enumerate(ys):
            close(f"allgather from {q}", y, value(q, (2 + q, 3), dtype))
    ok("gather/allgather")

    # alltoall: rank r sends value(r, (r+1, s+1), salt=s) to rank s
    sent = [value(r, (r + 1, s + 1), np.float32, s) for s in range(n)]
    got = comm.alltoall(sent)
    for q, x in enumerate(got):
        close(f"alltoall from {q}", x, value(q, (q + 1, r + 1), np.float32, r))
    ok("alltoall")

    root = 1 % n
    parts = [value(root, (q + 2,), np.float16, q) for q in range(n)] if r == root else None
    close("scatter", comm.scatter(parts, root=root), value(root, (r + 2,), np.float16, r))
    b = comm.bcast(value(7, (2, 5), np.float64) if r == root else None, root=root)
    close("bcast", b, value(7, (2, 5), np.float64))
    b16 = comm.bcast(value(7, (300,), np.float16) if r == 0 else None)
    close("bcast f16 chunked", b16, value(7, (300,), np.float16))
    ok("scatter/bcast")

    # point to point in a ring, arrays then objects, uneven shapes
    dest, source = (r + 1) % n, (r - 1) % n
    if n > 1:
        if r % 2 == 0:
            comm.send(value(r, (r + 1, 2), np.float16), dest, tag=3)
            x = comm.recv(source, tag=3)
        else:
            x = comm.recv(source, tag=3)
            comm.send(value(r, (r + 1, 2), np.float16), dest, tag=3)
        close("send/recv", x, value(source, (source + 1, 2), np.float16))
        if r % 2 == 0:
            comm.send_obj({"from": r}, dest, tag=4)
            o = comm.recv_obj(source, tag=4)
        else:
            o = comm.recv_obj(source, tag=4)
            comm.send_obj({"from": r}, dest, tag=4)
        assert o == {"from": source}, o
        # ANY_SOURCE: each message's parts must come from one sender, never mixed
        if r == 0:
            got_from = []
            for _ in range(n - 1):
                x = comm.recv(MPI.ANY_SOURCE, tag=6)
                q = x.shape[0] - 1
                close(f"recv ANY_SOURCE from {q}", x, value(q, (q + 1, 3), np.float32))
                got_from.append(q)
            assert sorted(got_from) == list(range(1, n)), got_from
        else:
            comm.send(value(r, (r + 1, 3), np.float32), 0, tag=6)
    ok("send/recv")

    assert comm.bcast_obj({"k": [r]} if r == 0 else None) == {"k": [0]}
    gathered = comm.gather_obj(("r", r), root=0)
    assert gathered == ([("r", q) for q in range(n)] if r == 0 else None), gathered
    assert comm.allgather_obj(r * 10) == [q * 10 for q in range(n)]
    assert comm.allreduce_obj(r + 1) == n * (n + 1) // 2
    assert comm.allreduce_obj([r]) == list(range(n))
    assert comm.allreduce_obj(r, op="max") == n - 1
    objs = [f"to {q}" for q in range(n)] if r == 0 else None
    assert comm.scatter_obj(objs) == f"to {r}"
    ok("objects")

    # bcast_data: every rank ends with root's parameters; uninitialised ones skipped
    model = FakeModel(
        {
            "/w": Param(value(r, (5, 4), np.float32), None),
            "/b": Param(value(r, (4,), np.float16), None),
            "/lazy": Param(None, None),
            "/big": Param(value(r, (40, 3), np.float64), None),
        }
    )
    comm.bcast_data(model)
    close("bcast_data w", model.params["/w"].data, value(0, (5, 4), np.float32))
    close("bcast_data b", model.params["/b"].data, value(0, (4,), np.float16))
    close("bcast_data big", model.params["/big"].data, value(0, (40, 3), np.float64))
    assert model.params["/lazy"].data is None
    ok("bcast_data")

    # multi_node_mean_grad with None grads, zero_fill False (same on all ranks) and True
    for zero_fill in (False, True):
        model = FakeModel(
            {
                "/a": Param(np.zeros((6, 5), np.float32), value(r, (6, 5), np.float32)),
                "/h": Param(np.zeros(9, np.float16), value(r, (9,), np.float16)),
                "/d": Param(np.zeros((3, 3), np.float64), value(r, (3, 3), np.float64)),
                "/none": Param(np.zeros(4, np.float32), None),
                "/lazy": Param(None, None),
            }
        )
        comm.multi_node_mean_grad(model, zero_fill=zero_fill)
        for key, shape, dtype in (
            ("/a", (6, 5), np.float32),
            ("/h", (9,), np.float16),
            ("/d", (3, 3), np.float64),
        ):
            want = (sum(value(q, shape, np.float64) for q in range(n)) / n).astype(dtype)
            close(f"mean_grad {key} zero_fill={zero_fill}", model.params[key].grad, want)
        if zero_fill:
            close("zero_fill grad", model.params["/none"].grad, np.zeros(4, np.float32))
        else:
            assert model.params["/none"].grad is None
        assert model.params["/lazy"].grad is None
    # every rank ends with bit-identical gradients
    for key in ("/a", "/h", "/d"):
        mine = model.params[key].grad
        for q, other in enumerate(comm.allgather(mine)):
            assert np.array_equal(other, mine), f"{key}: rank {q} differs from rank {r}"
    print(f"SHM {tag} {comm._shm is not None}", flush=True)
    # the same layout twice more: the cached plan and buffer are reused and stay correct
    for step in range(2):
        g = value(r, (6, 5), np.float32, step)
        model = FakeModel({"/a": Param(np.zeros((6, 5), np.float32), g)})
        comm.multi_node_mean_grad(model)
        want = (sum(value(q, (6, 5), np.float64, step) for q in range(n)) / n).astype(np.float32)
        close(f"mean_grad step {step}", model.params["/a"].grad, want)
    ok("multi_node_mean_grad")

    # allreduce_grad_dtype: float16 buckets for float32 grads
    comm16 = create_communicator(name, allreduce_grad_dtype=np.float16)
    model = FakeModel({"/a": Param(np.zeros(8, np.float32), value(r, (8,), np.float32))})
    comm16.multi_node_mean_grad(model)
    want = (sum(value(q, (8,), np.float64) for q in range(n)) / n).astype(np.float32)
    # float16 on the wire: float16 precision, though the grads are float32
    close("allreduce_grad_dtype=float16", model.params["/a"].grad, want, tol=1e-2)
    comm16.finalize()
    ok("allreduce_grad_dtype")

    # ChainerMN's older names and runtime configuration
    model = FakeModel({"/a": Param(value(r, (3,), np.float32), value(r, (3,), np.float32))})
    comm.broadcast_data(model)
    close("broadcast_data", model.params["/a"].data, value(0, (3,), np.float32))
    comm.allreduce_grad(model)
    want = (sum(value(q, (3,), np.float64) for q in range(n)) / n).astype(np.float32)
    close("allreduce_grad", model.params["/a"].grad, want)
    with comm.config_scope():
        comm.set_config("allreduce_grad_dtype", np.float64)
        comm.set_config("bucket_bytes", 8)
        assert comm.within_config_scope
        assert comm.get_config("allreduce_grad_dtype") == np.float64
        model.params["/a"].grad = value(r, (3,), np.float32)
        comm.multi_node_mean_grad(model)
        close("mean_grad with float64 buckets of 8 bytes", model.params["/a"].grad, want)
    assert not comm.within_config_scope
    assert comm.get_config() == {
        "allreduce_grad_dtype": None,
        "bucket_bytes": 64 if small_buckets else comm.bucket_bytes,
        "batched_copy": True,
    }
    ok("chainermn compatibility")

    # split: evens and odds, same class, collectives inside the group only
    sub = comm.split(r % 2, r)
    assert type(sub) is type(comm)
    members = [q for q in range(n) if q % 2 == r % 2]
    assert (sub.rank, sub.size) == (members.index(r), len(members))
    close(
        "split allreduce",
        sub.allreduce(np.array([float(r)])),
        np.array([float(sum(members))]),
    )
    assert sub.allgather_obj(r) == members
    sub.finalize()
    ok("split")

    comm.barrier()
    comm.finalize()
    comm.finalize()  # idempotent
    try:
        comm.barrier()
    except RuntimeError:
        pass
    else:
        raise AssertionError("a finalized communicator must refuse collectives")
    passed(tag)


if __name__ == "__main__":
    small = os.environ.get("MNIFY_SMALL_BUCKETS") == "1"
    for arg in sys.argv[1:]:
        comm_name, _, mode = arg.partition("/")
        modes = {m for m in mode.split("+") if m} | ({"small"} if small else set())
        # "mpi": reduce over MPI even where shared memory would do (read at creation)
        os.environ["MNIFY_SHARED_MEMORY"] = "0" if "mpi" in modes else "1"
        check(comm_name, modes)
