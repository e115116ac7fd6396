"""How a global batch is cut into the ranks' contiguous shares: evenly, by fixed weights, or by
each rank's measured speed.

Every function here is deterministic in its inputs, so ranks that feed it the same numbers (the
speed split allgathers them first) cut the batch identically without further agreement.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from mnify.runtime import observers


def even_shares(total: int, size: int) -> list[int]:
    """``total`` examples over ``size`` ranks, the first ``total % size`` ranks one more."""
    base, extra = divmod(total, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


def proportional_shares(total: int, weights: Sequence[float], minimum: int = 1) -> list[int]:
    """Integers summing to ``total``, proportional to ``weights``, each at least ``minimum``
    (when ``total`` allows it: a batch smaller than ``minimum * size`` gives ones and zeros).

    Largest remainders, ties to the lower rank; what the minimum takes is taken from the ranks
    furthest above their proportional value.
    """
    size = len(weights)
    if size == 0:
        raise ValueError("no ranks to share among")
    if total < minimum * size:
        return even_shares(total, size)
    positive = [max(float(w), 0.0) for w in weights]
    weight_sum = sum(positive)
    if not math.isfinite(weight_sum) or weight_sum <= 0:
        return even_shares(total, size)
    ideal = [total * w / weight_sum for w in positive]
    shares = [int(math.floor(x)) for x in ideal]
    order = sorted(range(size), key=lambda r: (-(ideal[r] - shares[r]), r))
    for r in order[: total - sum(shares)]:
        shares[r] += 1
    for r in range(size):
        while shares[r] < minimum:
            donor = max(
                (d for d in range(size) if shares[d] > minimum), key=lambda d: shares[d] - ideal[d]
            )
            shares[donor] -= 1
            shares[r] += 1
    return shares


class CollectiveClock(observers.Observer):
    """Seconds this rank spent inside collectives and point-to-point calls, from the
    communicators' published events (:mod:`mnify.runtime.observers`): the time a fast rank
    waits for a slow one, which must not count as its own compute."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.inside = 0.0
        self._entered: float | None = None

    def _enter(self) -> None:
        self._entered = self.clock()

    def _leave(self) -> None:
        if self._entered is not None:
            self.inside += self.clock() - self._entered
            self._entered = None

    def collective_enters(self, comm: Any, kind: str, seq: int, nbytes: int, *rest: Any) -> None:
        self._enter()

    def collective_leaves(self, comm: Any, kind: str, seq: int, failed: bool, result: Any) -> None:
        self._leave()

    def point_to_point_enters(self, comm: Any, kind: str, seq: int, peer: int, args: Any) -> None:
        self._enter()

    def point_to_point_leaves(
        self, comm: Any, kind: str, seq: int, failed: bool, result: Any
    ) -> None:
        self._leave()


class SpeedSplit:
    """Shares in proportion to each rank's measured examples per second.

    Each rank's seconds per example of the last step (its step time less the time inside
    collectives, over its share) are smoothed by an exponential moving average (``alpha``); the
    shares are proportional to the inverse. They change only when some rank's share is a whole
    example or more away from its proportional value, so noise does not make them oscillate.
    With constant speeds the shares are within one example of proportional from the second step.
    """

    def __init__(self, size: int, alpha: float = 0.5) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.size = size
        self.alpha = alpha
        self.seconds_per_example: list[float | None] = [None] * size
        self.shares: list[int] = []

    def observe(self, measured: Sequence[float | None]) -> None:
        """Fold in every rank's seconds per example of the last step (None: nothing measured)."""
        for r, value in enumerate(measured):
            if value is None or not math.isfinite(value) or value <= 0:
                continue
            old = self.seconds_per_example[r]
            self.seconds_per_example[r] = (
                value if old is None else self.alpha * value + (1 - self.alpha) * old
            )

    def proportional(self, total: int) -> list[float]:
        """Each rank's proportional (real-valued) share of ``total`` by the smoothed speeds."""
        known = [s for s in self.seconds_per_example if s is not None]
        if len(known) < self.size:
            return [total / self.size] * self.size
        speeds = [1.0 / s for s in known]
        return [total * v / sum(speeds) for v in speeds]

    def split(self, total: int) -> list[int]:
        """This step's shares of ``total`` examples."""
        if any(s is None for s in self.seconds_per_example):
            shares = even_shares(total, self.size)
        else:
            ideal = self.proportional(total)
            keep = (
                sum(self.shares) == total
                and min(self.shares, default=0) >= min(1, total // self.size)
                and all(abs(n - x) < 1 for n, x in zip(self.shares, ideal, strict=True))
            )
            shares = self.shares if keep else proportional_shares(total, ideal)
        self.shares = list(shares)
        return list(shares)
