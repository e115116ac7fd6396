"""The linear scaling rule with a gradual warm-up, as a Trainer extension.

Weak scaling trains N ranks with N times the batch. Goyal et al. (2017, "Accurate, Large
Minibatch SGD") keep the accuracy of the small batch by multiplying the learning rate by N,
reached linearly over the first epochs (5 in the paper) so the early, unstable steps are not
taken at the full rate. ``mnify convert --scale-lr linear`` adds

    trainer.extend(mn.LinearWarmup(comm.size, warmup_epochs=5))

The factor goes from 1 at epoch 0 to ``scale`` at ``warmup_epochs`` and stays there. It is
applied on top of whatever the script's own schedule sets: the extension runs after every other
extension (lowest priority), remembers the value it set last, and treats any other value it finds
as the schedule's new unscaled rate (an ``ExponentialShift`` that just fired, a ``lr *= 0.1`` in
user code). So the script's schedule keeps its shape, scaled by the same factor. Which
hyperparameter is the learning rate is decided per optimizer: ``alpha`` for the Adam family,
``lr`` for the others (RMSprop's ``alpha`` is a decay rate); an optimizer with none (AdaDelta)
is left alone with a warning.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import chainer
from chainer.training import extension


def learning_rate_attribute(optimizer: Any) -> str | None:
    """``alpha`` for Adam and its subclasses, ``lr`` for optimizers that have one, else None."""
    actual = optimizer.__dict__.get("actual_optimizer", optimizer)
    if isinstance(actual, chainer.optimizers.Adam):
        return "alpha"
    hyperparam = getattr(actual, "hyperparam", None)
    if hyperparam is not None and hasattr(hyperparam, "lr"):
        return "lr"
    return None


class LinearWarmup(extension.Extension):  # type: ignore[misc]
    """Multiply the optimizers' learning rate by ``scale``, reached linearly over
    ``warmup_epochs`` epochs (see the module docstring).

    Args:
        scale: the final factor (``comm.size`` for the linear scaling rule).
        warmup_epochs: epochs over which the factor grows from 1 to ``scale`` (0: at once).
        attr: the hyperparameter to scale; None picks each optimizer's learning rate.
        optimizers: names of the updater's optimizers to scale; None: all of them.
    """

    trigger = (1, "iteration")
    # After every other extension (Chainer's lowest is PRIORITY_READER = 100): a schedule that
    # sets the rate at this iteration has done so when the factor is applied.
    priority = 0

    def __init__(
        self,
        scale: float,
        warmup_epochs: float = 5,
        attr: str | None = None,
        optimizers: list[str] | None = None,
    ) -> None:
        if scale <= 0:
            raise ValueError(f"LinearWarmup: scale must be positive, got {scale}")
        if warmup_epochs < 0:
            raise ValueError(f"LinearWarmup: warmup_epochs must be >= 0, got {warmup_epochs}")
        self.scale = float(scale)
        self.warmup_epochs = float(warmup_epochs)
        self.attr = attr
        self.optimizers = None if optimizers is None else list(optimizers)
        self._base: dict[str, float] = {}  # each optimizer's unscaled rate
        self._last: dict[str, float] = {}  # the value this extension set last
        self._warned: set[str] = set()

    def factor(self, epoch_detail: float) -> float:
        """The multiplier at ``epoch_detail`` epochs: 1 at 0, ``scale`` from the warm-up's end."""
        if self.warmup_epochs <= 0:
            return self.scale
        progress = min(1.0, max(0.0, epoch_detail) / self.warmup_epochs)
        return 1.0 + (self.scale - 1.0) * progress

    def initialize(self, trainer: Any) -> None:
        self._apply(trainer)

    def __call__(self, trainer: Any) -> None:
        self._apply(trainer)

    def _apply(self, trainer: Any) -> None:
        updater = trainer.updater
        factor = self.factor(float(updater.epoch_detail))
        for name, optimizer in sorted(updater.get_all_optimizers().items()):
            if self.optimizers is not None and name not in self.optimizers:
                continue
            attr = self.attr or learning_rate_attribute(optimizer)
            if attr is None:
                if name not in self._warned:
                    self._warned.add(name)
                    warnings.warn(
                        f"LinearWarmup: optimizer {name!r} ({type(optimizer).__name__}) has no "
                        "learning rate hyperparameter; left unscaled",
                        stacklevel=2,
                    )
                continue
            current = float(getattr(optimizer, attr))
            if name not in self._last or current != self._last[name]:
                self._base[name] = current  # set by someone else: the new unscaled rate
            value = self._base[name] * factor
            setattr(optimizer, attr, value)
            self._last[name] = value

    def serialize(self, serializer: Any) -> None:
        """Keep the unscaled rates across a resume (the optimizer holds the scaled one)."""
        state = json.dumps({"base": self._base, "last": self._last}, sort_keys=True)
        state = serializer("state", state)
        if isinstance(state, str) and state:
            loaded = json.loads(state)
            self._base = {k: float(v) for k, v in loaded.get("base", {}).items()}
            self._last = {k: float(v) for k, v in loaded.get("last", {}).items()}
