"""Generational per-rank checkpoints, and resuming from the newest one every rank has.

Each rank writes its own snapshot ``<name>.<rank>.<iteration>`` (ChainerMN's file names, so its
checkpoints resume here too) into the trainer's output directory or ``path``. A job that died
may have written some ranks' newest snapshot but not others'; ``maybe_load`` therefore loads the
newest iteration for which *every* rank has a file. Older generations are deleted once the
ranks agree they hold newer common ones (``cp_interval`` are kept). After a run that ends
normally the checkpoints are removed; after a run that raised they are kept for the restart.

    checkpointer = mn.create_multi_node_checkpointer(name="run1", comm=comm)
    trainer.extend(checkpointer, trigger=(1000, "iteration"))
    checkpointer.maybe_load(trainer, optimizer)   # after every stateful extension is added
    trainer.run()
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np
from chainer.training import extension

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


# the number of ranks that wrote a checkpoint (it resumes only at that number)
WORLD_SIZE_KEY = "mnify_checkpoint/world_size"


class MultiNodeCheckpointer(extension.Extension):  # type: ignore[misc]
    """The extension :func:`create_multi_node_checkpointer` returns; see the module docstring."""

    def __init__(
        self,
        name: str,
        comm: CommunicatorBase,
        cp_interval: int = 5,
        gc_interval: int = 5,
        path: str | None = None,
    ) -> None:
        if not name or "." in name:
            raise ValueError(f"checkpoint name must be non-empty and without '.', got {name!r}")
        if cp_interval <= 0 or gc_interval <= 0:
            raise ValueError("cp_interval and gc_interval must be positive")
        self.name = name  # type: ignore[assignment]  # also the trainer's name for the extension
        self.comm = comm
        self.cp_interval = cp_interval
        self.gc_interval = gc_interval
        self.path = path
        self.iterations: list[int] = []  # this rank's checkpoints on disk, oldest first
        self.durations: list[float] = []
        self._saves_since_gc = 0  # the same on every rank: they save at the same steps
        self._failed = False

    # -- files ---------------------------------------------------------------------------------

    def filename(self, iteration: int, rank: int | None = None) -> str:
        rank = self.comm.rank if rank is None else rank
        return f"{self.name}.{rank}.{iteration}"

    def _own_iterations_on_disk(self) -> list[int]:
        assert self.path is not None
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            return []
        found: list[int] = []
        for entry in entries:
            parts = entry.split(".")
            if len(parts) == 3 and parts[0] == self.name and parts[1] == str(self.comm.rank):
                if parts[2].isdigit():
                    found.append(int(parts[2]))
        return sorted(found)

    def _common_iterations(self) -> list[int]:
        """Iterations every rank holds a checkpoint of (one allgather), oldest first."""
        everyone = self.comm.allgather_obj(self.iterations)
        common = set(everyone[0])
        for iterations in everyone[1:]:
            common &= set(iterations)
        return sorted(common)

    def _remove(self, iteration: int) -> None:
        assert self.path is not None
        try:
            os.remove(os.path.join(self.path, self.filename(iteration)))
        except FileNotFoundError:
            pass

    # -- saving --------------------------------------------------------------------------------

    def __call__(self, trainer: chainer.training.Trainer) -> None:
        if self.path is None:
            self.path = trainer.out
        self.save(trainer, trainer.updater.iteration)

    def save(self, target: Any, iteration: int) -> None:
        """Write ``target``'s snapshot for ``iteration``; every rank must call it at the same step.

        The file appears atomically (written to a temporary name, then renamed), so a crash
        never leaves a truncated checkpoint under a valid name.
        """
        if self.path is None:
            raise ValueError("no checkpoint directory: pass path= or use it as a trainer extension")
        os.makedirs(self.path, exist_ok=True)
        started = time.perf_counter()
        fd, tmp = tempfile.mkstemp(prefix=f"tmp-{self.filename(iteration)}", dir=self.path)
        os.close(fd)
        try:
            serializer = chainer.serializers.DictionarySerializer()
            serializer.save(target)
            serializer.target[WORLD_SIZE_KEY] = np.asarray(self.comm.size)
            with open(tmp, "wb") as stream:
                np.savez(stream, **serializer.target)
            os.replace(tmp, os.path.join(self.path, self.filename(iteration)))
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        self.durations.append(time.perf_counter() - started)
        if iteration not in self.iterations:
            self.iterations.append(iteration)
        self._saves_since_gc += 1
        if self._saves_since_gc >= self.gc_interval:
            self._saves_since_gc = 0
            self._collect_garbage()

    def _collect_garbage(self) -> None:
        """Keep the newest ``cp_interval`` common generations (and anything newer than them).

        A collective: every rank calls it after the same number of saves.
        """
        common = self._common_iterations()
        keep = set(common[-self.cp_interval :])
        if not keep:
            return
        oldest_kept = min(keep)
        for iteration in list(self.iterations):
            if iteration in keep or iteration > oldest_kept:
                continue
            self._remove(iteration)
            self.iterations.remove(iteration)

    # -- resuming ------------------------------------------------------------------------------

    def maybe_load(
        self, trainer: Any, optimizer: Any = None, path: str | None = None
    ) -> int | None:
        """Load the newest checkpoint every rank has into ``trainer``; its iteration, or None.

        Every rank must call it. With ``optimizer`` (the multi-node one) the next update skips
        its initial broadcast: all ranks loaded snapshots of the same step.
        """
        if path is not None:
            self.path = path
        elif self.path is None:
            self.path = trainer.out
        self.iterations = self._own_iterations_on_disk()
        self._refuse_other_world_size()
        common = self._common_iterations()
        if not common:
            return None
        iteration = common[-1]
        chainer.serializers.load_npz(os.path.join(self.path, self.filename(iteration)), trainer)
        if optimizer is not None and hasattr(optimizer, "mark_synchronized"):
            optimizer.mark_synchronized()
        return iteration

    def _written_by(self) -> tuple[int | None, int]:
        """(the world size recorded in this rank's newest checkpoint, or None; the highest rank
        number among this run's checkpoint files here, or -1)."""
        assert self.path is not None
        recorded = None
        if self.iterations:
            newest = os.path.join(self.path, self.filename(self.iterations[-1]))
            try:
                with np.load(newest) as npz:
                    if WORLD_SIZE_KEY in npz.files:
                        recorded = int(npz[WORLD_SIZE_KEY])
            except (OSError, ValueError):
                recorded = None
        highest = -1
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            entries = []
        for entry in entries:
            parts = entry.split(".")
            if len(parts) == 3 and parts[0] == self.name and parts[1].isdigit():
                highest = max(highest, int(parts[1]))
        return recorded, highest

    def _refuse_other_world_size(self) -> None:
        """Raise on every rank (one allgather) if the checkpoints were written by a job of
        another size: a shard's iterator state means nothing at another size."""
        everyone = self.comm.allgather_obj(self._written_by())
        sizes = {size for size, _ in everyone if size is not None}
        highest = max(h for _, h in everyone)
        other = sorted(s for s in sizes if s != self.comm.size)
        if other or highest >= self.comm.size:
            written = other[0] if other else f"at least {highest + 1}"
            raise ValueError(
                f"the per-rank checkpoints '{self.name}' in {self.path} were written by "
                f"{written} ranks; this job has {self.comm.size}. Per-rank checkpoints "
                "(create_multi_node_checkpointer) resume only at the size that wrote them: to "
                "resume at another size, train with mn.create_global_batch_iterator and write "
                "mn.extensions.global_snapshot(), then load it with mn.load_global_snapshot"
            )

    def get_stats(self) -> str:
        """How long saving took: average, minimum and maximum seconds."""
        if not self.durations:
            return "no checkpoints taken"
        d = self.durations
        return f"checkpoint seconds: avg={sum(d) / len(d):f}, min={min(d):f}, max={max(d):f}"

    def on_error(self, trainer: Any, exc: BaseException, tb: Any) -> None:
        self._failed = True  # keep the checkpoints: the restart needs them

    def finalize(self) -> None:
        """After a run that ended normally, delete this rank's checkpoints."""
        if self._failed or self.path is None:
            return
        for iteration in self.iterations:
            self._remove(iteration)
        self.iterations = []


def create_multi_node_checkpointer(
    name: str,
    comm: CommunicatorBase,
    cp_interval: int = 5,
    gc_interval: int = 5,
    path: str | None = None,
) -> MultiNodeCheckpointer:
    """A trainer extension writing per-rank checkpoints that ``maybe_load`` resumes from.

    ``name`` identifies the run; ``cp_interval`` generations are kept, garbage is collected after
    ``gc_interval`` more; ``path`` defaults to the trainer's output directory.
    """
    return MultiNodeCheckpointer(name, comm, cp_interval, gc_interval, path)
