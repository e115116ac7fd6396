"""Make every Chainer Trainer data-parallel when it starts running: for training the converter
cannot reach.

A domain library's ``run_train(model, train, valid, ...)`` builds its own optimizer, iterators,
Trainer and extensions and runs them; no statement of the user's script can wrap them.
``mnify convert`` then adds ``mn.distribute_trainers(comm)`` right after the communicator, and
from then on each ``chainer.training.Trainer`` is converted at the start of its ``run()``
(``Trainer.run`` is wrapped once, when ``distribute_trainers`` is called; nothing is installed
before):

* the updater's optimizers become multi-node optimizers (``create_multi_node_optimizer``), put
  in the updater in place of the plain ones, so the first update broadcasts rank 0's parameters
  and every later one averages the gradients;
* iterators of Chainer's own classes (``SerialIterator``, ``MultiprocessIterator``,
  ``MultithreadIterator``) are rebuilt with the same constructor arguments over this rank's share
  of the dataset. The shares come from rank 0's dataset through ``scatter_dataset`` (rank 0's is
  the one definition: a library that splits its data at random without a seed gives every rank
  a different dataset, and shares taken locally would then overlap or miss examples), split by a
  fixed-seed permutation, so every run puts the same examples on the same rank. Training data is
  split with ``force_equal_length`` (every rank runs the same number of updates), evaluation data
  without it (no example counts twice). A dataset that is already a share is left as it is;
* iterators of any other class cannot be rebuilt: they are reported as needing a person;
* the extensions are distributed as :func:`mnify.runtime.distribute_extensions` does: evaluators
  multi-node, extensions that write or print on rank 0 only. An extension that is not Chainer's
  (the library's own ``AutoPrintReport``) runs on every rank, as it may change what training
  shares, but prints on rank 0 only (:mod:`mnify.runtime.extensions.quiet`); a file it writes
  on another rank is named at exit by the write net (docs/write_net.md).

Rank 0 prints what it did, once per trainer, and at exit says so if no Trainer ran at all (a
hand-written loop is not reached). A trainer converted before, and a multi-node optimizer, are
left as they are.
"""

from __future__ import annotations

import atexit
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import chainer
from chainer import iterators as chainer_iterators
from chainer.training import extensions as chainer_extensions

from mnify.runtime.datasets.scatter_dataset import is_share, scatter_dataset
from mnify.runtime.extensions.distribute import RANK0_ONLY, distribute_extensions
from mnify.runtime.extensions.quiet import is_python_class, quiet_on_this_rank
from mnify.runtime.optimizers import _WrapperBase, create_multi_node_optimizer

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

# The permutation that decides which examples go to which rank (not the iterators' own order).
SPLIT_SEED = 0
_CONVERTED = "_mn_distributed"


@dataclass
class TrainerReport:
    """What :func:`distribute_trainer` did to one trainer (rank 0 prints it)."""

    optimizers: list[str] = field(default_factory=list)  # made multi-node
    iterators: list[str] = field(default_factory=list)  # rebuilt over this rank's share
    evaluators: list[str] = field(default_factory=list)
    rank0_only: list[str] = field(default_factory=list)
    quiet: list[str] = field(default_factory=list)  # on every rank, printing on rank 0 only
    left: list[str] = field(default_factory=list)  # already distributed, left as they are
    needs_person: list[str] = field(default_factory=list)

    def lines(self, rank_sizes: str) -> list[str]:
        out = [f"mnify: distribute_trainers: a Trainer starts running; {rank_sizes}"]
        for title, items in (
            ("multi-node optimizers", self.optimizers),
            ("iterators over this rank's share", self.iterators),
            ("multi-node evaluators", self.evaluators),
            ("on rank 0 only", self.rank0_only),
            ("on every rank, printing on rank 0 only", self.quiet),
            ("already distributed, left as they are", self.left),
            ("NEEDS A PERSON", self.needs_person),
        ):
            for item in items:
                out.append(f"mnify:   {title}: {item}")
        return out


def _is_multi_node(optimizer: Any) -> bool:
    """mnify's wrappers, and ChainerMN's (``_MultiNodeOptimizer`` and friends)."""
    return isinstance(optimizer, _WrapperBase) or "MultiNode" in type(optimizer).__name__


def _distribute_optimizers(updater: Any, comm: CommunicatorBase, report: TrainerReport) -> None:
    """Replace the updater's optimizers by multi-node ones: in its optimizer table (what
    ``get_optimizer`` and ``update_core`` read) and in any attribute of the updater that holds
    the same object (a custom updater's ``self.opt_gen``)."""
    table = getattr(updater, "_optimizers", None)
    if not isinstance(table, dict):
        report.needs_person.append(
            f"updater {type(updater).__name__} keeps no optimizer table (_optimizers): "
            "its optimizers are not multi-node; wrap them with create_multi_node_optimizer"
        )
        return
    for name, optimizer in list(table.items()):
        label = f"{name!r} ({type(optimizer).__name__})"
        if _is_multi_node(optimizer):
            report.left.append(f"optimizer {label}")
            continue
        wrapped = create_multi_node_optimizer(optimizer, comm)
        table[name] = wrapped
        for attribute, value in list(vars(updater).items()):
            if value is optimizer:
                setattr(updater, attribute, wrapped)
        report.optimizers.append(label)


# Chainer's iterator classes and the constructor arguments besides dataset and batch size, as
# (keyword, attribute the instance keeps it in).
_REBUILDABLE: dict[type, tuple[tuple[str, str], ...]] = {
    chainer_iterators.SerialIterator: (("repeat", "_repeat"),),
    chainer_iterators.MultithreadIterator: (("repeat", "_repeat"), ("n_threads", "n_threads")),
    chainer_iterators.MultiprocessIterator: (
        ("repeat", "repeat"),
        ("n_processes", "n_processes"),
        ("n_prefetch", "n_prefetch"),
        ("shared_mem", "shared_mem"),
        ("dataset_timeout", "dataset_timeout"),
        ("maxtasksperchild", "_maxtasksperchild"),
    ),
}


def _constructor_arguments(iterator: Any) -> dict[str, Any]:
    """The keyword arguments that rebuild ``iterator`` (of an exact class of ``_REBUILDABLE``)
    over another dataset. The order sampler is reused as it is (a seeded one keeps its seed);
    ``shuffle=False`` left none."""
    kwargs = {key: getattr(iterator, attribute) for key, attribute in _REBUILDABLE[type(iterator)]}
    if iterator.order_sampler is None:
        kwargs["shuffle"] = False
    else:
        kwargs["order_sampler"] = iterator.order_sampler
    return kwargs


def _share(dataset: Any, comm: CommunicatorBase, training: bool) -> Any:
    """This rank's share of rank 0's ``dataset``; see the module docs for the split."""
    return scatter_dataset(
        dataset, comm, shuffle=True, seed=SPLIT_SEED, force_equal_length=training
    )


def _rebuilt(
    iterator: Any, comm: CommunicatorBase, training: bool, label: str, report: TrainerReport
) -> Any:
    """The iterator to use instead of ``iterator``: itself when it cannot or need not be rebuilt
    (said in ``report``), else a new one of its class over this rank's share. Collective for
    the iterators it rebuilds: every rank reaches the same ones in the same order."""
    kind = type(iterator).__name__
    if type(iterator) not in _REBUILDABLE:
        report.needs_person.append(
            f"{label} is a {kind}, not one of Chainer's iterators: it still reads the whole "
            "dataset on every rank; give it scatter_dataset(dataset, comm) or build it in the "
            "converted code"
        )
        return iterator
    dataset = iterator.dataset
    if is_share(dataset):
        report.left.append(f"{label} ({kind}): its dataset is already this rank's share")
        return iterator
    if iterator.epoch_detail > 0:
        report.needs_person.append(
            f"{label} ({kind}) has advanced already (resumed from a snapshot?): its rebuilt copy "
            "starts at the beginning of this rank's share"
        )
    kwargs = _constructor_arguments(iterator)
    share = _share(dataset, comm, training)
    if isinstance(iterator, chainer_iterators.MultiprocessIterator):
        iterator.finalize()  # its worker processes, if it started them
    fresh = type(iterator)(share, iterator.batch_size, **kwargs)
    split = "force_equal_length" if training else "no example twice"
    report.iterators.append(
        f"{label} ({kind}, batch {iterator.batch_size} per rank): {len(share)} of "
        f"{len(dataset)} examples ({split})"
    )
    return fresh


def _distribute_iterators(trainer: Any, comm: CommunicatorBase, report: TrainerReport) -> None:
    updater = trainer.updater
    table = getattr(updater, "_iterators", None)
    if not isinstance(table, dict):
        report.needs_person.append(
            f"updater {type(updater).__name__} keeps no iterator table (_iterators): its data "
            "is not split among the ranks"
        )
    else:
        for name, iterator in list(table.items()):
            fresh = _rebuilt(iterator, comm, True, f"training iterator {name!r}", report)
            if fresh is not iterator:
                table[name] = fresh
                for attribute, value in list(vars(updater).items()):
                    if value is iterator:
                        setattr(updater, attribute, fresh)
    for ext_name, entry in trainer._extensions.items():
        extension = entry.extension
        if not isinstance(extension, chainer_extensions.Evaluator):
            continue
        if "_mn_original_evaluate" in vars(extension):
            report.left.append(f"evaluator {ext_name!r}: multi-node already, its data as it is")
            continue
        iterators = extension._iterators
        for name, iterator in list(iterators.items()):
            label = f"evaluator {ext_name!r} iterator {name!r}"
            iterators[name] = _rebuilt(iterator, comm, False, label, report)


def _is_chainers(extension: Any) -> bool:
    """An extension of Chainer's own (a class or a ``make_extension`` function of Chainer)."""
    module = getattr(extension, "__module__", None) or type(extension).__module__
    return module.split(".")[0] == "chainer"


def _describe_extensions(trainer: Any, comm: CommunicatorBase, report: TrainerReport) -> None:
    """What :func:`distribute_extensions` will do, for the report (read before it runs)."""
    for name, entry in trainer._extensions.items():
        extension = entry.extension
        kind = type(extension).__name__
        if isinstance(extension, chainer_extensions.Evaluator):
            report.evaluators.append(f"{name!r} ({kind})")
        elif isinstance(extension, chainer_extensions.LogReport):
            report.rank0_only.append(f"{name!r} ({kind}: its file; the log stays on every rank)")
        elif isinstance(extension, RANK0_ONLY):
            report.rank0_only.append(f"{name!r} ({kind})")
        elif not _is_chainers(extension):
            report.quiet.append(f"{name!r} ({kind}: not Chainer's)")


def _quiet_other_ranks(trainer: Any, comm: CommunicatorBase, report: TrainerReport) -> None:
    """On ranks other than 0, the extensions that are not Chainer's print nothing (see the
    module docs). One that cannot be silenced is said on rank 0 as needing a person (every rank
    gets the same answer: it depends on the class only)."""
    for name, entry in trainer._extensions.items():
        extension = entry.extension
        if isinstance(extension, chainer_extensions.Evaluator) or _is_chainers(extension):
            continue
        quiet = quiet_on_this_rank(extension) if comm.rank != 0 else extension
        if quiet is None or (comm.rank == 0 and not _can_be_silenced(extension)):
            label = f"{name!r} ({type(extension).__name__}: not Chainer's)"
            if label in report.quiet:
                report.quiet.remove(label)
            report.needs_person.append(
                f"extension {label} cannot be silenced on the other ranks: it prints on every "
                "rank; if it only reports, register it on rank 0 only"
            )
        elif quiet is not extension:
            entry.extension = quiet


def _can_be_silenced(extension: Any) -> bool:
    """Whether :func:`quiet_on_this_rank` can silence an extension like this one (asked on
    rank 0, which keeps its own unchanged)."""
    return isinstance(extension, types.FunctionType) or is_python_class(type(extension))


def distribute_trainer(trainer: Any, comm: CommunicatorBase) -> TrainerReport | None:
    """Convert ``trainer`` for ``comm`` (see the module docs); None when it was converted
    before. Every rank must call it on the same trainer, before the trainer's first update."""
    if getattr(trainer, _CONVERTED, None) is not None:
        return None
    report = TrainerReport()
    setattr(trainer, _CONVERTED, report)
    _distribute_optimizers(trainer.updater, comm, report)
    _distribute_iterators(trainer, comm, report)
    _describe_extensions(trainer, comm, report)
    distribute_extensions(trainer, comm)
    _quiet_other_ranks(trainer, comm, report)
    global _converted
    _converted += 1
    if comm.rank == 0:
        sizes = f"{comm.size} ranks, out {trainer.out!r}"
        print("\n".join(report.lines(sizes)), file=sys.stdout, flush=True)
    return report


def trainer_report(trainer: Any) -> TrainerReport | None:
    """What :func:`distribute_trainer` did to ``trainer`` (None: not converted)."""
    return getattr(trainer, _CONVERTED, None)


# the communicator the wrapped Trainer.run distributes over (the last distribute_trainers call)
_comm: CommunicatorBase | None = None
_converted = 0  # trainers this process converted


def _say_if_no_trainer_ran() -> None:
    """At exit on rank 0: a run in which no Trainer started was not distributed by this."""
    if _converted == 0:
        print(
            "mnify: distribute_trainers: no chainer.training.Trainer ran in this process, so "
            "nothing was made data-parallel at run time (a hand-written training loop needs "
            "create_multi_node_optimizer and scatter_dataset where it is written)",
            file=sys.stderr,
            flush=True,
        )


_WRAPPED = "_mn_distributes_trainers"


def distribute_trainers(comm: CommunicatorBase) -> None:
    """From now on, convert every ``chainer.training.Trainer`` for ``comm`` when its ``run()``
    starts (see the module docs). Every rank calls it, once, right after creating ``comm``;
    calling it again only changes the communicator."""
    global _comm
    _comm = comm
    trainer_class = chainer.training.Trainer
    if getattr(trainer_class.run, _WRAPPED, False):
        return
    if comm.rank == 0:
        atexit.register(_say_if_no_trainer_ran)
    original = trainer_class.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _comm is not None:
            distribute_trainer(self, _comm)
        return original(self, *args, **kwargs)

    run.__doc__ = original.__doc__
    run.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(run, _WRAPPED, True)
    trainer_class.run = run  # type: ignore[method-assign]
