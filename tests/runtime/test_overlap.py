"""Gradient averaging overlapped with backward (``create_multi_node_optimizer(overlap=...)``).

Rank scripts compare the overlapped path with the sequential one over 20 steps on real ranks
(bitwise on 2 ranks, 1e-6 relative on 3; identical on every rank), for every communicator,
under the watchdog and in debug mode. Single-process tests cover the Chainer-free scheduler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from mnify.runtime.communicators.buckets import place_scale
from mnify.runtime.overlap import BucketScheduler
from mnify.runtime.timeline import Category, rank_file, read_file
from tests.runtime.chainer_scripts.launch import run_script
from tests.runtime.test_parity import CHECKS as PARITY_CHECKS
from tests.support.mpirun import run_ranks

CHECKS = [
    "MLP with a shared layer and an unused one, 20 steps",
    "CNN with a shared convolution and an unused one, 20 steps",
    "a parameter used on some ranks only is zero-filled on the others",
    "two backward calls per update average once, after the last",
    "a backward inside the loss function falls back to the sequential path",
    "overlap=None: on for pure_nccl only",
]


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("n_ranks", "comm"), [(2, "naive"), (2, "flat"), (3, "flat"), (3, "naive")]
)
def test_overlap_equals_sequential(n_ranks: int, comm: str) -> None:
    run_script(n_ranks, "overlap_checks.py", CHECKS, comm=comm)


@pytest.mark.mpi
def test_overlap_on_hierarchical_over_two_fake_hosts() -> None:
    run_script(3, "overlap_checks.py", CHECKS, comm="hierarchical", ranks_per_host=2)


@pytest.mark.mpi
def test_overlap_under_watchdog_and_debug() -> None:
    run_script(
        2,
        "overlap_checks.py",
        CHECKS,
        comm="flat",
        extra_env={"MNIFY_WATCHDOG_TIMEOUT": "60", "MNIFY_DEBUG": "1"},
    )


@pytest.mark.mpi
def test_overlap_on_pure_nccl_stand_in() -> None:
    """pure_nccl (CuPy/NCCL stood in) with host parameters: overlap on by default, MPI path."""
    run_script(2, "overlap_checks.py", CHECKS, comm="pure_nccl")


class _Recorder:
    """A reducer that only records what the scheduler asks of it."""

    wire = np.dtype(np.float32)
    scale_before = 0.5

    def __init__(self) -> None:
        self.started: list[int] = []
        self.finished = 0

    def allocate(self, n: int) -> Any:
        return np.zeros(n, dtype=self.wire)

    def start(self, number: int, views: list[Any], buf: Any) -> None:
        self.started.append(number)
        buf[:] = np.concatenate([v.ravel() for v in views]) * self.scale_before

    def progress(self) -> None:
        pass

    def finish(self, unpack: list[tuple[Any, list[Any]]]) -> None:
        self.finished += 1
        for buf, views in unpack:
            at = 0
            for v in views:
                v[...] = buf[at : at + v.size]
                at += v.size


def test_buckets_start_in_plan_order_once_their_arrays_are_final() -> None:
    reducer = _Recorder()
    # 4 arrays of 3 float32 each, 8 per bucket: buckets [0, 1], [2, 3]
    sched = BucketScheduler([3, 3, 3, 3], reducer, bucket_bytes=32, own_bucket_bytes=None)
    assert [[i for i, _, _ in b] for b in sched.buckets] == [[0, 1], [2, 3]]
    grads = [np.full(3, float(i + 1), np.float32) for i in range(4)]
    sched.ready(2, grads[2])
    sched.ready(3, grads[3])
    assert reducer.started == []  # bucket 1 is ready but bucket 0 must start first
    sched.ready(0, grads[0])
    assert reducer.started == []
    sched.ready(1, grads[1])
    assert reducer.started == [0, 1] and sched.started_early == 2
    sched.wait(lambda i: pytest.fail("every array was ready"))
    assert reducer.finished == 1
    assert [float(g[0]) for g in grads] == [0.5, 1.0, 1.5, 2.0]


def test_wait_fills_arrays_never_ready_and_writes_back_strided_ones() -> None:
    reducer = _Recorder()
    sched = BucketScheduler([4, 2], reducer, bucket_bytes=16, own_bucket_bytes=None)
    strided = np.arange(8, dtype=np.float32).reshape(4, 2)[:, 0]  # not contiguous
    sched.ready(0, strided)
    filled = np.zeros(2, np.float32)
    sched.wait(lambda i: filled)
    assert strided.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert sched.started_early == 1 and sched.started_late == 1
    with pytest.raises(ValueError, match="elements"):
        sched.ready(0, np.zeros(5, np.float32))


def test_the_scale_of_a_mean_goes_before_the_sum_on_mpi() -> None:
    assert place_scale(1 / 2, np.dtype(np.float32)).before == 0.5


HANG = r"""
import time
import chainer, chainer.functions as F, chainer.links as L
import numpy as np
from mnify.runtime.communicators import create_communicator
from mnify.runtime.optimizers import create_multi_node_optimizer

comm = create_communicator("flat")
comm.set_config("bucket_bytes", 256)
model = chainer.Sequential(L.Linear(4, 8), F.tanh, L.Linear(8, 2))
opt = create_multi_node_optimizer(chainer.optimizers.SGD(), comm, overlap=True)
opt.setup(model)
x = np.ones((3, 4), np.float32)
for step in range(4):
    if step == 2 and comm.rank == comm.size - 1:
        time.sleep(40)
    opt.update(lambda: F.sum(model(x)))
    print("STEP", step, "started in backward", opt.overlap_stats.started_in_backward, flush=True)
print("END", comm.rank)
"""


@pytest.mark.mpi
def test_watchdog_bounds_the_overlapped_wait_and_names_the_late_rank() -> None:
    """Buckets already started from backward, a rank that never comes: the wait before the
    update raises CollectiveTimeout naming it, and the job ends instead of hanging."""
    run = run_ranks(2, HANG, timeout=60, env={"MNIFY_WATCHDOG_TIMEOUT": "2"}, check=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    assert "CollectiveTimeout" in run.output, run.describe()
    assert "rank(s) 1 never arrived" in run.output, run.describe()
    # rank 0 had started buckets from backward in the step that timed out
    assert any(line.startswith("STEP 1 started in backward") for line in run.rank_lines(0))
    assert "END 0" not in run.rank_lines(0)


@pytest.mark.mpi
@pytest.mark.parametrize(("n_ranks", "comm"), [(2, "naive"), (3, "flat")])
def test_parity_suite_through_the_overlapped_path(n_ranks: int, comm: str) -> None:
    """The data-parallel parity checks (MultiNodeBatchNormalization's collectives inside
    backward, lazy layers, a Trainer) with ``MNIFY_OVERLAP=1``: every optimizer overlaps."""
    run_script(
        n_ranks, "parity_checks.py", PARITY_CHECKS, comm=comm, extra_env={"MNIFY_OVERLAP": "1"}
    )


TIMELINE = r"""
import chainer, chainer.functions as F, chainer.links as L
import numpy as np
from mnify.runtime.communicators import create_communicator
from mnify.runtime.optimizers import create_multi_node_optimizer

comm = create_communicator("flat")
comm.set_config("bucket_bytes", 256)
model = chainer.Sequential(L.Linear(4, 8), F.tanh, L.Linear(8, 8), F.tanh, L.Linear(8, 2))
opt = create_multi_node_optimizer(chainer.optimizers.SGD(), comm, overlap=True)
opt.setup(model)
x = np.ones((3, 4), np.float32)
for step in range(5):
    opt.update(lambda: F.sum(model(x)))
print("BUCKETS", opt.overlap_stats.buckets, "STEPS", opt.overlap_stats.steps, flush=True)
"""


@pytest.mark.mpi
def test_timeline_records_the_overlapped_buckets(tmp_path: Path) -> None:
    run = run_ranks(2, TIMELINE, timeout=60, env={"MNIFY_TIMELINE": str(tmp_path)})
    line = next(x for x in run.rank_lines(0) if x.startswith("BUCKETS"))
    buckets, steps = int(line.split()[1]), int(line.split()[3])
    for rank in range(2):
        events = read_file(rank_file(tmp_path, rank)).events
        ours = [e for e in events if e.name == "overlap bucket"]
        assert len(ours) == buckets * steps, (len(ours), buckets, steps)
        assert all(e.cat == Category.BUCKET and e.end is not None for e in ours)
        updates = [e for e in events if e.cat == Category.UPDATE]
        # every bucket lies inside its update
        for e in ours:
            u = next(u for u in updates if u.step == e.step)
            assert u.start <= e.start <= e.end and (u.end is None or e.end <= u.end)


class _Aliased(chainer.Chain):
    """``a + b`` back-propagates one array to both (Chainer's F.add): their gradients alias;
    ``w`` is used twice; ``never`` is never used."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.a = chainer.Parameter(np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3))
            self.b = chainer.Parameter(np.linspace(1, 2, 6).astype(np.float32).reshape(2, 3))
            self.w = L.Linear(3, 3)
            self.never = L.Linear(2, 2)

    def forward(self, x: Any) -> Any:
        h = self.w(F.tanh(self.w(x) + (self.a + self.b)))
        return F.sum(h * h)


@pytest.fixture(scope="module")
def one_rank() -> Any:
    from mnify.runtime.communicators import create_communicator

    comm = create_communicator("naive")
    yield comm
    comm.finalize()


@pytest.mark.filterwarnings("ignore:.*zerograd.* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("cleargrads", [True, False])
@pytest.mark.parametrize("loss_scale", [None, 8.0])
def test_taps_leave_chainer_gradients_bit_for_bit(
    one_rank: Any, cleargrads: bool, loss_scale: float | None
) -> None:
    """One rank: the overlapped update equals the sequential one bitwise, with aliased
    gradients, a shared layer, an unused layer, zerograds instead of cleargrads, loss scaling;
    and the parameters are leaves again afterwards."""
    from mnify.runtime.optimizers import create_multi_node_optimizer
    from mnify.runtime.overlap_hooks import GradTap

    finals = []
    for overlap in (False, True):
        np.random.seed(3)
        model = _Aliased()
        inner = chainer.optimizers.MomentumSGD(lr=0.1)
        if not cleargrads:
            inner._use_cleargrads = False
        if loss_scale is not None:
            inner.set_loss_scale(loss_scale)
        opt = create_multi_node_optimizer(inner, one_rank, overlap=overlap)
        opt.setup(model)
        rng = np.random.RandomState(0)
        for _ in range(4):
            x = rng.randn(2, 3).astype(np.float32)
            opt.update(model, x)
        assert all(p.node.creator_node is None for p in model.params())
        assert not any(isinstance(p.node.creator_node, GradTap) for p in model.params())
        finals.append({n: p.array.copy() for n, p in model.namedparams()})
        if overlap:
            assert opt.overlap_stats.steps == 4 and opt.overlap_stats.fallbacks == 0
            assert opt.overlap_stats.uses["/w/W"] == 2
    for name, want in finals[0].items():
        assert np.array_equal(finals[1][name], want), name
