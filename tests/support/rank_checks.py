"""What rank scripts (run under mpiexec, not pytest) share, and how pytest reads them back.

One communicator factory, one ``assert_close``, one protocol: a rank prints ``PASS <name>``
for each check it passed (a failing check raises, which ends the job non-zero and pytest shows
every rank's output); the pytest side asks :func:`missing` which expected names a rank never
printed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np


def fake_hosts() -> None:
    """Pretend the ranks of one machine run on several hosts (through ``MNIFY_HOSTNAME``), so
    the hierarchical communicator's intra- and inter-host paths both run; call it before
    anything reads the host name (:func:`make_comm` does).

    ``MNIFY_TEST_RANKS_PER_HOST=k``: ranks ``0..k-1`` share one host, ``k..2k-1`` the next, and
    so on. ``MNIFY_TEST_HOSTS="0,1,1"``: rank ``r`` is on the host its ``r``-th entry numbers (any
    layout, uneven or interleaved).
    """
    world_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    per_host = os.environ.get("MNIFY_TEST_RANKS_PER_HOST")
    layout = os.environ.get("MNIFY_TEST_HOSTS")
    if per_host:
        os.environ["MNIFY_HOSTNAME"] = f"fakehost{world_rank // int(per_host)}"
    elif layout:
        os.environ["MNIFY_HOSTNAME"] = f"fakehost{layout.split(',')[world_rank]}"


def make_comm() -> Any:
    """The communicator named by ``MNIFY_TEST_COMM`` (default ``naive``), on the hosts
    :func:`fake_hosts` pretends."""
    fake_hosts()
    from mnify import runtime as mn

    return mn.create_communicator(os.environ.get("MNIFY_TEST_COMM", "naive"))


def assert_close(
    name: str,
    actual: Any,
    expected: Any,
    rtol: float = 1e-5,
    atol: float = 1e-12,
    *,
    same_dtype: bool = False,
) -> None:
    """``actual`` equals ``expected`` (same shape) within ``rtol`` relative to the largest
    expected magnitude, or within ``atol`` absolutely (values that are exactly zero on one side
    and rounding noise on the other); the message names the check. ``same_dtype``: ``actual``
    must also have ``expected``'s dtype (a collective returns the dtype it was given)."""
    if same_dtype:
        got_dtype, want_dtype = np.asarray(actual).dtype, np.asarray(expected).dtype
        if got_dtype != want_dtype:
            raise AssertionError(f"{name}: dtype {got_dtype} != expected {want_dtype}")
    got = np.asarray(actual, dtype=np.float64)
    want = np.asarray(expected, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {got.shape} != expected {want.shape}")
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-12)
    diff = float(np.max(np.abs(got - want), initial=0.0))
    if not (diff / scale <= rtol or diff <= atol):
        raise AssertionError(
            f"{name}: relative error {diff / scale:.3g} > {rtol:g} (max abs {diff:g})\n"
            f"{got}\n!=\n{want}"
        )


def passed(name: str, comm: Any = None) -> None:
    """This rank passed check ``name`` (after a barrier, when given ``comm``: every rank did)."""
    if comm is not None:
        comm.barrier()
    print(f"PASS {name}", flush=True)


def missing(lines: Iterable[str], expected: Iterable[str]) -> list[str]:
    """The expected check names a rank's output lines never reported as passed."""
    done = {line[len("PASS ") :] for line in lines if line.startswith("PASS ")}
    return [name for name in expected if name not in done]


class _Param:
    def __init__(self, grad: np.ndarray) -> None:
        self.data = np.zeros_like(grad)
        self.grad = grad


class GradientModel:
    """What ``multi_node_mean_grad`` reads, without Chainer: parameters ``p0, p1, ...`` holding
    the given arrays as their gradients (averaged in place)."""

    def __init__(self, grads: list[np.ndarray]) -> None:
        self.params = {f"p{i}": _Param(g) for i, g in enumerate(grads)}

    def namedparams(self) -> list[tuple[str, _Param]]:
        return list(self.params.items())
