"""mnify.runtime.update_watch: every optimizer update seen once, and a clean stop on every rank.

In-process: a plain Chainer optimizer, mnify's multi-node wrapper around one, and a custom
optimizer class defined after watching began (calling ``super().update()``) are each counted
once per step; unsubscribing restores Chainer's methods. In a fresh process: nothing is
installed until a function of the module is called. On 1 and 2 real ranks: a Trainer script
and a hand-written GAN-like loop stop after exactly K updates on every rank, their ``finally``
blocks and atexit handlers run, and ``mnify run`` reports the job as stopped, not failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import chainer
import chainer.links as L
import numpy as np
import pytest

from mnify.runtime import update_watch
from tests.cli_run.console import mnify_run
from tests.support.mpirun import mpi_env, run_ranks

SCRIPTS = Path(__file__).resolve().parent / "update_watch_scripts"


class _Single:
    """A one-rank stand-in communicator: the wrapper's collectives are identities."""

    rank, size = 0, 1

    def bcast_data(self, model: Any) -> None:
        pass

    def multi_node_mean_grad(self, model: Any, zero_fill: bool = False) -> None:
        pass


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, int]] = []

    def before_update(self, optimizer: Any, index: int) -> None:
        self.calls.append(("before", optimizer, index))

    def after_update(self, optimizer: Any, index: int) -> None:
        self.calls.append(("after", optimizer, index))


def _step(link: chainer.Link, optimizer: Any) -> None:
    x = np.ones((2, 3), np.float32)
    loss = chainer.functions.sum(link(x))
    link.cleargrads()
    loss.backward()
    optimizer.update()


def test_each_update_is_reported_once_plain_wrapped_and_subclassed() -> None:
    from mnify.runtime.optimizers import create_multi_node_optimizer

    recorder = _Recorder()
    unsubscribe = update_watch.watch_updates(recorder)
    try:
        plain_link, wrapped_link, custom_link = L.Linear(3, 2), L.Linear(3, 2), L.Linear(3, 2)
        plain = chainer.optimizers.SGD(0.1)
        plain.setup(plain_link)
        wrapped = create_multi_node_optimizer(chainer.optimizers.MomentumSGD(0.1), _Single())
        wrapped.setup(wrapped_link)

        class Custom(chainer.optimizers.SGD):  # defined while watching: wrapped when made
            def update(self, lossfun: Any = None, *args: Any, **kwds: Any) -> None:
                super().update(lossfun, *args, **kwds)

        custom = Custom(0.1)
        custom.setup(custom_link)
        for _ in range(3):
            _step(plain_link, plain)
            _step(wrapped_link, wrapped)
            _step(custom_link, custom)
        by_optimizer = {
            name: [(kind, i) for kind, opt, i in recorder.calls if opt is which]
            for name, which in (("plain", plain), ("wrapped", wrapped), ("custom", custom))
        }
        expected = [("before", 1), ("after", 1), ("before", 2), ("after", 2)]
        expected += [("before", 3), ("after", 3)]
        assert by_optimizer == {"plain": expected, "wrapped": expected, "custom": expected}
        # the wrapped optimizer's inner update is part of the wrapper's, never its own
        assert not any(opt is wrapped.actual_optimizer for _, opt, _ in recorder.calls)
        assert len(recorder.calls) == 18
        assert (plain.t, wrapped.t, custom.t) == (3, 3, 3)
    finally:
        unsubscribe()
    assert not update_watch.is_installed()
    assert not getattr(chainer.optimizer.GradientMethod.update, "_mnify_watched", False)
    assert "__init_subclass__" not in chainer.Optimizer.__dict__


def test_stop_after_updates_raises_a_system_exit_after_the_nth_update() -> None:
    link = L.Linear(3, 2)
    opt = chainer.optimizers.SGD(0.1)
    opt.setup(link)
    calls: list[int] = []
    update_watch.stop_after_updates(2, "unit", on_stop=lambda n: calls.append(n) or 7)
    try:
        _step(link, opt)
        with pytest.raises(update_watch.UpdateLimitReached) as stop:
            _step(link, opt)
        assert isinstance(stop.value, SystemExit)
        assert (stop.value.updates, stop.value.reason, stop.value.code) == (2, "unit", 7)
        assert calls == [2] and opt.t == 2
    finally:
        update_watch.cancel_stop()
    assert not update_watch.is_installed()


def test_nothing_is_installed_until_asked() -> None:
    """A fresh process trains with the runtime imported and used: Chainer's classes untouched."""
    code = """
import chainer, chainer.links as L, numpy as np
from mnify import runtime as mn
from mnify.runtime import update_watch
from mnify.runtime import optimizers
comm = mn.create_communicator("naive")
link = L.Linear(3, 2)
opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(0.1), comm)
opt.setup(link)
loss = chainer.functions.sum(link(np.ones((2, 3), np.float32)))
loss.backward()
opt.update()
watched = [c.__name__ for c in (chainer.optimizer.GradientMethod, optimizers.MultiNodeOptimizer)
           if getattr(c.__dict__["update"], "_mnify_watched", False)]
print(watched, update_watch.is_installed(), "__init_subclass__" in chainer.Optimizer.__dict__)
update_watch.watch_updates(object())
print(getattr(chainer.optimizer.GradientMethod.update, "_mnify_watched", False))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=mpi_env(), timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[] False False", "True"]


def _results(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[len("RESULT ") :]) for line in lines if line.startswith("RESULT ")]


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [1, 2])
def test_trainer_stops_after_exactly_k_updates_on_every_rank(n_ranks: int, tmp_path: Path) -> None:
    run = run_ranks(n_ranks, SCRIPTS / "trainer_stop.py", ["--stop", "4"], cwd=tmp_path)
    assert "NOT STOPPED" not in run.output
    results = sorted(
        (r for rank in range(n_ranks) for r in _results(run.rank_lines(rank))),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in results] == list(range(n_ranks))
    for r in results:
        assert (r["t"], r["iteration"], r["finalized"]) == (4, 3, True)  # iteration++ after
        assert r["before"] == [1, 2, 3, 4]
        assert r["after"] == [["MultiNodeOptimizer", i] for i in (1, 2, 3, 4)]


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [1, 2])
def test_hand_written_loop_with_two_optimizers_stops_after_both_made_k(
    n_ranks: int, tmp_path: Path
) -> None:
    run = run_ranks(n_ranks, SCRIPTS / "loop_stop.py", ["--stop", "3"], cwd=tmp_path)
    assert "NOT STOPPED" not in run.output
    results = [r for rank in range(n_ranks) for r in _results(run.rank_lines(rank))]
    assert sorted(r["rank"] for r in results) == list(range(n_ranks))
    for r in results:
        assert (r["gen_t"], r["dis_t"], r["finally"]) == (3, 3, True)
        assert r["counted"] == {"gen": [1, 2, 3], "dis": [1, 2, 3]}


@pytest.mark.mpi
def test_mnify_run_reports_a_stop_as_stopped_not_failed(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    proc = mnify_run(
        "-n", "2", "--summary-json", str(summary), str(SCRIPTS / "trainer_stop.py"), "--stop", "2"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(summary.read_text())
    assert data["category"] == "stopped"
    assert data["stop"] == {"updates": 2, "reason": "test", "ranks": [0, 1]}
    assert "Traceback" not in proc.stderr
