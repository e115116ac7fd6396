"""The two project-wide policies, decided once every file of a conversion has been planned.

A conversion is for a distributed job. A script that trains nothing is no part of it and is
left as it is; and when no optimizer of the whole project could be made multi-node (training
happens where the communicator cannot reach), the project is left as it is with a report that
says why, or, where the training runs a chainer Trainer, distributed at run time instead
(``rewrites.trainers``).
"""

from __future__ import annotations

from collections.abc import Mapping

from mnify import vocabulary as vocab
from mnify.rewrites import guards, trainers
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import EditPlan
from mnify.rewrites.report import ReportEntry


def apply_project_policies(contexts: Mapping[str, FileContext]) -> None:
    """Both policies, the project's (nothing parallel) before each script's (trains nothing)."""
    leave_alone_if_nothing_is_parallel(contexts)
    leave_alone_scripts_that_do_not_train(contexts)


def _reset(ctx: FileContext) -> None:
    """Forget every planned edit of a file (it is left as it is)."""
    ctx.plan = EditPlan(comm=ctx.plan.comm)
    ctx.comm_needed = False
    ctx.imports_needed.clear()
    ctx.preamble = []
    ctx.report.claims = []


def leave_alone_scripts_that_do_not_train(contexts: Mapping[str, FileContext]) -> None:
    """A script of the converted tree that trains nothing (data preparation, prediction,
    evaluation of a saved model) is no part of the distributed job: it gets no communicator
    and stays as it is, instead of needing MPI or evaluating one shard."""
    for ctx in contexts.values():
        entry = ctx.entry
        if entry is None or entry.exists or not ctx.comm_needed or ctx.distribute_trainers:
            continue
        if not ctx.options.data_parallel or ctx.options.only_codes is not None:
            continue
        # an ``update`` call is training only where the effects cannot tell (``df.update(d)``
        # is not; ``optimizer.update()`` and a library helper's Trainer are: program/effects.py)
        trains = any(
            ctx.builds_optimizer(c)
            or vocab.is_trainer(c.qname)
            or (c.method == "update" and ctx.effects is None)
            for c in ctx.facts.calls
        ) or any(e.step == "optimizer" and e.severity == "changed" for e in ctx.report.entries)
        reached = [ctx.effects_of_scope(entry.func), ctx.effects_of_scope(None)]
        if trains or any("trains" in found for found in reached):
            continue
        _reset(ctx)
        # its evaluation loops are no part of the job: nobody needs to make them multi-node
        ctx.report.keep_only_needs_person()
        ctx.report.drop(lambda e: e.step == "evaluator")
        ctx.report.entries.append(
            ReportEntry(
                ctx.path,
                1,
                "communicator",
                "info",
                "this script trains nothing (no optimizer, trainer or update): it is no part of "
                "the distributed job and is left as it is",
                "MN801",
            )
        )


def leave_alone_if_nothing_is_parallel(contexts: Mapping[str, FileContext]) -> None:
    """Issue 12, pattern 7: when training happens where the communicator cannot reach (inside a
    library helper, or in code outside the converted files), no optimizer becomes multi-node and
    a converted script would only look parallel. Then nothing is changed and the report says
    plainly why and what to do."""
    if not contexts or not all(
        ctx.options.data_parallel and ctx.options.only_codes is None for ctx in contexts.values()
    ):
        return
    entries = [e for ctx in contexts.values() for e in ctx.report.entries]
    if any(e.step == "optimizer" and e.severity == "changed" for e in entries):
        return
    stranded = [e for e in entries if e.step == "optimizer" and e.severity == "needs-person"]
    built = [
        (ctx, c)
        for ctx in contexts.values()
        for c in ctx.facts.calls
        if ctx.builds_optimizer(c) and not vocab.is_multi_node_optimizer_factory(c.parent_qname)
    ]
    if any(ctx.suppressed(c.node, "optimizer") for ctx, c in built):
        return  # the user kept the optimizer as it is on purpose
    iterators = any(
        vocab.is_iterator(c.qname) for ctx in contexts.values() for c in ctx.facts.calls
    )
    loads = any(
        vocab.is_dataset_factory(c.qname) for ctx in contexts.values() for c in ctx.facts.calls
    )
    # an entry point that builds a model and calls a training function it does not define
    # (``run_train(model, ...)`` of a library) hands its model to training elsewhere
    models = any(
        vocab.is_link_name(c.qname) and c.cls is None
        for ctx in contexts.values()
        if ctx.entry is not None
        for c in ctx.facts.calls
    ) and any(trainers.calls_training_elsewhere(ctx) for ctx in contexts.values())
    # training found in an installed package's source (``run_train(model, it)``)
    elsewhere = any(trainers.trains_through_a_package(ctx) for ctx in contexts.values())
    if not stranded and not built and not elsewhere and (iterators or not (loads or models)):
        return  # no training at all here (a model or data module on its own)
    if stranded:
        where = (
            f"the optimizer is built at {stranded[0].path}:{stranded[0].line}, where the "
            "communicator is not in scope"
        )
    elif built:
        ctx0, call0 = built[0]
        where = (
            f"the optimizer is built at {ctx0.path}:{ctx0.line(call0.node)} inside training "
            "code the entry point calls, which does not hand it back (a library-style helper)"
        )
    else:
        where = (
            "no optimizer is built in the converted files: training happens in code that was "
            "not converted (a library helper)"
        )
    trains_with_a_trainer = any(
        vocab.is_trainer(c.qname) for ctx in contexts.values() for c in ctx.facts.calls
    )
    hosts = trainers.hosts(contexts)
    mnify_target = all(ctx.options.target == "mnify" for ctx in contexts.values())
    # a project converted before (its communicator exists) is left as it is, as below
    fresh = not any(ctx.entry is not None and ctx.entry.exists for ctx in contexts.values())
    if mnify_target and fresh and hosts and (trains_with_a_trainer or not (stranded or built)):
        _distribute_at_run_time(contexts, hosts, where, outside=not (stranded or built))
        return
    for ctx in contexts.values():
        _reset(ctx)
        ctx.report.keep_only_needs_person()
    first = next(iter(contexts.values()))
    first.report.entries.append(
        ReportEntry(
            first.path,
            1,
            "optimizer",
            "needs-person",
            f"nothing was parallelised: {where}. Pass a communicator into the code that trains "
            "(create it where the script starts, hand it down) and wrap its optimizer with "
            "create_multi_node_optimizer and its datasets with scatter_dataset there, or convert "
            "that code too; a script that only looked converted would train N identical copies"
            + (
                ""
                if mnify_target
                else " (ChainerMN has no run-time distribution of trainers; with --target "
                "mnify the converter adds mn.distribute_trainers(comm) when that code runs a "
                "chainer Trainer)"
            ),
            "MN503",
        )
    )


# needs-person entries that run-time distribution answers (the optimizer, datasets and
# evaluators of the unreachable training code)
_COVERED_AT_RUN_TIME = frozenset({"optimizer", "dataset", "evaluator"})


def _distribute_at_run_time(
    contexts: Mapping[str, FileContext], hosts: list[FileContext], where: str, outside: bool
) -> None:
    """The fallback when the training runs a Trainer the converter cannot reach: everything
    planned stays (rank guards, the communicator), each host gets
    ``mn.distribute_trainers(comm)`` after its communicator, and the helpers' first-use caches
    are built by rank 0 (``rewrites.trainers``)."""
    host_ids = {id(ctx) for ctx in hosts}
    for ctx in contexts.values():
        ctx.report.drop(lambda e: e.severity == "needs-person" and e.step in _COVERED_AT_RUN_TIME)
    quiet: set[str] = set()
    if not outside:
        waiting: set[tuple[str, str]] = set()
        flow = trainers.training_flow(hosts)
        for ctx in contexts.values():
            entry_func = ctx.entry.func if ctx.entry is not None else None
            quiet |= trainers.plan_helpers(
                contexts, ctx, entry_func if id(ctx) in host_ids else None, waiting, flow
            )
        # a helper that now waits at a barrier is called by every rank
        guards.withdraw_effect_plans(contexts.values(), waiting)
    for ctx in contexts.values():
        trainers.drop_answered_print_notes(ctx, quiet)
    for ctx in hosts:
        trainers.plan_host(ctx, where)
        if outside:
            trainers.report_unreachable_caches(ctx)
