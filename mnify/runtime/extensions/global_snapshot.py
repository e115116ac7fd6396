"""One snapshot of the whole run, written by rank 0, that resumes at any number of ranks.

``trainer.extend(mn.extensions.global_snapshot(), trigger=(1000, "iteration"))`` is used like
Chainer's ``extensions.snapshot``: the file is named by ``filename.format(trainer)`` in
``trainer.out`` and holds what ``chainer.serializers.save_npz(path, trainer)`` holds -- model,
optimizer state, updater and its iterators. With a global-batch iterator
(:mod:`mnify.runtime.iterators.global_batch_iterator`) none of it depends on the world size (the
iterator's state is the one-process schedule: epoch, position, the epoch's order, its seed, the
global batch), so every rank of a job of any size resumes it with
``chainer.serializers.load_npz(path, trainer)`` or :func:`load_global_snapshot`, and continues
with exactly the examples not yet seen. The file is written atomically (a temporary name, then a
rename) and kept after the run.

Per-rank checkpoints (``create_multi_node_checkpointer``) hold a shard's iterator and resume only
at the size that wrote them; :func:`load_global_snapshot` refuses one with a message saying so.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np
from chainer.training import extension

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

# an entry only global snapshots have: the world size that wrote it (for messages only)
MARK = "mnify_global_snapshot/written_by_ranks"


def _communicator(comm: CommunicatorBase | None) -> CommunicatorBase:
    if comm is not None:
        return comm
    from mnify.runtime.communicators import current_communicator

    return current_communicator()


class GlobalSnapshot(extension.Extension):  # type: ignore[misc]
    """The extension :func:`global_snapshot` returns; see the module docstring."""

    trigger = (1, "epoch")
    # Chainer's snapshot's: after the other extensions of the same iteration updated their
    # state (a GrowBatch on the same trigger has already grown the global batch)
    priority = -100

    def __init__(
        self, filename: str, comm: CommunicatorBase | None = None, target: Any = None
    ) -> None:
        self.filename = filename
        self.comm = comm
        self.target = target
        self.written: list[str] = []  # paths this rank wrote (rank 0 only)

    def __call__(self, trainer: chainer.training.Trainer) -> None:
        comm = _communicator(self.comm)
        if comm.rank != 0:
            return
        target = trainer if self.target is None else self.target
        path = os.path.join(trainer.out, self.filename.format(trainer))
        save_global_snapshot(path, target, comm.size)
        self.written.append(path)


def save_global_snapshot(path: str, target: Any, world_size: int) -> None:
    """Write ``target``'s state to ``path`` atomically, marked as a global snapshot."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    serializer = chainer.serializers.DictionarySerializer()
    serializer.save(target)
    serializer.target[MARK] = np.asarray(world_size)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}", dir=directory)
    try:
        with os.fdopen(fd, "wb") as stream:
            np.savez(stream, **serializer.target)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def global_snapshot(
    filename: str = "snapshot_iter_{.updater.iteration}",
    *,
    comm: CommunicatorBase | None = None,
    target: Any = None,
) -> GlobalSnapshot:
    """A trainer extension writing one world-size-independent snapshot on rank 0.

    ``filename``: formatted with the trainer, as in Chainer's ``snapshot``; ``comm``: the
    communicator (default: the one created last); ``target``: what to save (default: the
    trainer). Give it a trigger with ``trainer.extend(..., trigger=...)``.
    """
    return GlobalSnapshot(filename, comm, target)


def load_global_snapshot(path: str, target: Any) -> None:
    """Load the global snapshot ``path`` into ``target`` (usually the trainer), on every rank.

    Refuses a per-rank checkpoint (``create_multi_node_checkpointer``'s ``name.RANK.ITER``) with
    a message saying to write global snapshots for runs that change size. Equivalent to
    ``chainer.serializers.load_npz(path, target)`` otherwise; after it the multi-node optimizer
    is told the ranks share parameters.
    """
    with np.load(path) as npz:
        marked = MARK in npz.files
    if not marked:
        raise ValueError(
            f"{path} is not a global snapshot (a per-rank checkpoint of "
            "create_multi_node_checkpointer, or Chainer's snapshot of one rank): those resume "
            "only at the size that wrote them. To resume at another number of ranks, train with "
            "mn.create_global_batch_iterator and write mn.extensions.global_snapshot()"
        )
    chainer.serializers.load_npz(path, target)
    updater = getattr(target, "updater", None)
    for optimizer in getattr(updater, "get_all_optimizers", dict)().values():
        if hasattr(optimizer, "mark_synchronized"):
            optimizer.mark_synchronized()
