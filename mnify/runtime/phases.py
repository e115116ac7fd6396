"""One phase of a job that grows its ranks: ``mnify run --grow-ranks 4@30e,8@60e``.

The launcher runs the script once per phase, each time with more ranks, and tells the ranks
(``phase_*`` in ``MNIFY_LAUNCH``, :class:`mnify.environment.LaunchWiring`) where the phase
resumes and where it stops. Nothing changes in the script: when a ``chainer.training.Trainer``
starts running (``Trainer.run`` is wrapped once, when the communicator is made),

- a phase after the first loads the previous phase's global snapshot into it
  (:func:`mnify.runtime.extensions.global_snapshot.load_global_snapshot`: model, optimizer,
  updater, the global-batch iterator's schedule with its current global batch), so it goes on
  with exactly the examples not yet seen;
- a phase with a milestone (``30e``: epoch 30, ``500i``: iteration 500) stops at the first update
  boundary at or after it: after that update's extensions ran (a GrowBatch on the same trigger
  has grown the batch), rank 0 writes the global snapshot and a small JSON record beside it,
  every rank waits for the file, and the process leaves *inside* ``run()`` with exit status 0,
  so the code after ``trainer.run()`` runs once, after the last phase.

Resuming at another world size needs the world-size-independent state of the global-batch
iterator (docs/global_batch.md); a trainer whose iterator is a per-rank one gets a clear error at
the first milestone instead of a silently different run.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

MILESTONE = re.compile(r"^(\d+)([ei])$")


@dataclass(frozen=True)
class Milestone:
    """Where a phase ends: epoch or iteration ``value`` (``unit`` ``e`` or ``i``)."""

    value: int
    unit: str

    @classmethod
    def parse(cls, text: str) -> Milestone:
        m = MILESTONE.match(text.strip())
        if not m or int(m.group(1)) < 1:
            raise ValueError(
                f"{text!r} is not a milestone: a positive number of epochs (30e) or iterations "
                "(500i)"
            )
        return cls(int(m.group(1)), m.group(2))

    def reached(self, updater: Any) -> bool:
        if self.unit == "e":
            return float(updater.epoch_detail) >= self.value
        return int(updater.iteration) >= self.value

    def __str__(self) -> str:
        return f"{self.value}{self.unit}"


def record_path(snapshot: str) -> str:
    """The JSON record rank 0 writes beside a phase's snapshot: how far the phase got."""
    return snapshot + ".json"


class PhaseEnds(BaseException):
    """Raised by the milestone check inside ``Trainer.run``; the wrapper turns it into exit 0.
    Not an ``Exception``: Chainer's loop would print it as a failure before re-raising."""


_installed = False


def install(
    comm: CommunicatorBase, stop: str | None, snapshot: str | None, resume: str | None
) -> None:
    """Wrap ``Trainer.run`` (once) to resume from ``resume`` and stop at ``stop``."""
    global _installed
    if _installed:
        return
    _installed = True
    milestone = Milestone.parse(stop) if stop else None
    if milestone is not None and not snapshot:
        raise ValueError("a phase with a milestone needs a snapshot path (MNIFY_LAUNCH)")
    from chainer import training

    original = training.Trainer.run
    state = {"resumed": False}

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if resume and not state["resumed"]:
            from mnify.runtime.extensions.global_snapshot import load_global_snapshot

            load_global_snapshot(resume, self)
            state["resumed"] = True
            if comm.rank == 0:
                print(
                    f"mnify: phase resumed on {comm.size} ranks from {resume} at iteration "
                    f"{self.updater.iteration}",
                    file=sys.stderr,
                    flush=True,
                )
        if milestone is not None and snapshot is not None:
            self.extend(_stop_at(milestone, snapshot, comm), name="mnify_phase_stop")
        try:
            return original(self, *args, **kwargs)
        except PhaseEnds:
            comm.barrier()  # rank 0's snapshot is on disk for every rank of the next phase
            sys.stdout.flush()
            raise SystemExit(0) from None

    training.Trainer.run = run  # type: ignore[method-assign]


def _stop_at(milestone: Milestone, snapshot: str, comm: CommunicatorBase) -> Any:
    from chainer import training

    from mnify.runtime.extensions.global_snapshot import save_global_snapshot
    from mnify.runtime.iterators.global_batch_iterator import GlobalBatchIterator

    # the lowest priority: every other extension of the milestone's update runs first (Chainer's
    # snapshot has -100), so their triggers are saved as having fired and nothing is skipped or
    # run twice across the phases
    @training.make_extension(trigger=(1, "iteration"), priority=-(2**62))
    def stop(trainer: Any) -> None:
        updater = trainer.updater
        if not milestone.reached(updater):
            return
        iterator = updater.get_iterator("main")
        if not isinstance(iterator, GlobalBatchIterator):
            raise TypeError(
                f"mnify run --grow-ranks: the trainer's iterator is a {type(iterator).__name__}, "
                "whose state belongs to one world size; train with "
                "mn.create_global_batch_iterator (mnify convert --data global) to change the "
                "number of ranks"
            )
        if comm.rank == 0:
            save_global_snapshot(snapshot, trainer, comm.size)
            record = {
                "milestone": str(milestone),
                "iteration": int(updater.iteration),
                "epoch_detail": float(updater.epoch_detail),
                "global_batch": int(iterator.batch_size),
                "ranks": comm.size,
            }
            with open(record_path(snapshot), "w", encoding="utf-8") as stream:
                json.dump(record, stream)
            print(
                f"mnify: phase stops at {milestone} (iteration {updater.iteration}, global batch "
                f"{iterator.batch_size}); snapshot {os.path.basename(snapshot)}",
                file=sys.stderr,
                flush=True,
            )
        raise PhaseEnds

    return stop
