"""The multi-node optimizer passes for the user's optimizer (issue 31 item 9): ``isinstance`` and
class dispatch see the wrapped class, and its attributes read and write through."""

from __future__ import annotations

import copy
import functools
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from mnify.runtime.optimizers import create_multi_node_optimizer


class OneRank:
    """What the wrapper asks of a communicator, for one process (nothing to exchange)."""

    name, rank, size = "naive", 0, 1

    def bcast_data(self, model: Any) -> None:
        pass

    def multi_node_mean_grad(self, model: Any, zero_fill: bool = True) -> None:
        pass


@pytest.mark.parametrize(
    "make",
    [
        lambda: chainer.optimizers.Adam(alpha=0.01),
        lambda: chainer.optimizers.MomentumSGD(lr=0.1),
    ],
    ids=["Adam", "MomentumSGD"],
)
def test_isinstance_and_dispatch_see_the_users_class(make: Any) -> None:
    actual = make()
    opt = create_multi_node_optimizer(actual, OneRank())
    assert isinstance(opt, type(actual)) and isinstance(opt, chainer.Optimizer)
    assert isinstance(opt, chainer.GradientMethod)
    assert not isinstance(opt, chainer.optimizers.RMSprop)

    @functools.singledispatch
    def kind(optimizer: Any) -> str:
        return "other"

    @kind.register
    def _(optimizer: chainer.optimizers.Adam) -> str:
        return "adam"

    @kind.register
    def _(optimizer: chainer.optimizers.MomentumSGD) -> str:
        return "momentum"

    assert kind(opt) == kind(actual) != "other"
    assert type(opt).__name__ == "MultiNodeOptimizer"  # type() still names the wrapper


def test_attributes_read_and_write_through() -> None:
    actual = chainer.optimizers.Adam(alpha=0.01)
    opt = create_multi_node_optimizer(actual, OneRank())
    model = L.Linear(3, 2)
    assert opt.setup(model) is opt
    assert opt.target is model is actual.target
    opt.alpha = 0.02
    assert actual.alpha == actual.hyperparam.alpha == opt.hyperparam.alpha == 0.02
    opt.hyperparam.beta1 = 0.8
    assert actual.beta1 == 0.8
    opt.update(lambda: F.sum(model(np.ones((2, 3), np.float32))))
    assert opt.t == actual.t == 1
    assert opt.lr == actual.lr  # Adam's lr is computed from alpha and t
    sgd = chainer.optimizers.MomentumSGD(lr=0.1)
    wrapped = create_multi_node_optimizer(sgd, OneRank())
    wrapped.lr = 0.05
    assert sgd.lr == 0.05 and sgd.hyperparam.lr == 0.05


def test_copies_stay_wrappers() -> None:
    opt = create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), OneRank())
    opt.setup(L.Linear(3, 2))
    for duplicate in (copy.copy(opt), copy.deepcopy(opt)):
        assert type(duplicate).__name__ == "MultiNodeOptimizer"
        assert isinstance(duplicate, chainer.optimizers.SGD)
        assert duplicate.lr == 0.1
