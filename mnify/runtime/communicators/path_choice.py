"""Choosing between two ways of doing the same collective by timing both, on every rank alike.

On one host a mean can stage buckets through the shared-memory segment or reduce straight in
the other ranks' memory (:mod:`~mnify.runtime.communicators.single_copy`). Which is faster
depends on the machine's memory system at the time, not on anything a rank can inspect: on the
2-vCPU VM this was built on, the same launch command gave, for ResNet-50's gradients, segment
14.5 ms / single copy 15-18 ms in one period and segment 37-50 ms / single copy 13-17 ms in
another (``bench/allreduce.py``). So the communicator times both and keeps the faster.

Both paths give the same bits (the same sum order, the same scale), so the choice never
changes results. It must be the same on every rank, or ranks would run different collectives:
every trial's time is the slowest rank's (``max_over_ranks``, one small all-reduce per trial
call), so every rank sees the same numbers and makes the same choice. Trials repeat every
``recheck_every`` calls, since the machine changes under a long job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class MeasuredChoice:
    """Which of ``paths`` each call takes. First ``warmup`` untimed calls per path (plans,
    buffers, page faults), then ``rounds`` timed calls per path, alternating; the path with the
    lowest best time is used until ``recheck_every`` calls later, when the timed calls repeat."""

    def __init__(
        self,
        paths: Sequence[str],
        max_over_ranks: Callable[[float], float],
        *,
        warmup: int = 1,
        rounds: int = 2,
        recheck_every: int = 256,
    ) -> None:
        if not paths:
            raise ValueError("MeasuredChoice needs at least one path")
        self.paths = list(paths)
        self._max_over_ranks = max_over_ranks
        self._rounds = rounds
        self._recheck_every = recheck_every
        # the calls still to come before a choice: (path, timed)
        self._pending = [(p, False) for _ in range(warmup) for p in self.paths]
        self._pending += self._trials()
        self._best: dict[str, float] = {}
        self._since_choice = 0
        self.chosen: str | None = None  # the winner of the last trials
        self.history: list[str] = []  # every choice made, in order

    def _trials(self) -> list[tuple[str, bool]]:
        return [(p, True) for _ in range(self._rounds) for p in self.paths]

    def run(self, calls: dict[str, Callable[[], None]], clock: Callable[[], float]) -> str:
        """Run this call's path (``calls[path]()``), timed when it is a trial; the path."""
        if not self._pending:
            assert self.chosen is not None
            calls[self.chosen]()
            self._since_choice += 1
            if self._since_choice >= self._recheck_every:
                self._pending = self._trials()
            return self.chosen
        path, timed = self._pending.pop(0)
        if timed:
            started = clock()
            calls[path]()
            elapsed = self._max_over_ranks(clock() - started)
            self._best[path] = min(self._best.get(path, elapsed), elapsed)
        else:
            calls[path]()
        if not self._pending:
            self.chosen = min(self.paths, key=lambda p: self._best.get(p, float("inf")))
            self.history.append(self.chosen)
            self._best = {}
            self._since_choice = 0
        return path
