"""DESIGN.md section 1, step "evaluator": every rank evaluates its shard, results are averaged.

``extensions.Evaluator(test_iter, model, device=...)`` (and constructions of this file's own
Evaluator subclasses) become ``mn.create_multi_node_evaluator(extensions.Evaluator(...), comm)``
on every rank. Not under ``--model-parallel channel``: there every rank already sees the same
batch.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites.context import FileContext
from mnify.rewrites.dataset import is_training_iterator, iterator_calls
from mnify.rewrites.optimizer import wrap_call
from mnify.rewrites.registry import rewrite


def _check_early_stopping(ctx: FileContext) -> None:
    """Ranks must stop together: the monitored value has to be the same on every rank."""
    for call in ctx.facts.calls:
        if not vocab.is_early_stopping(call.qname):
            continue
        monitor = next(
            (a.value for a in call.node.args if a.keyword and a.keyword.value == "monitor"), None
        )
        if isinstance(monitor, cst.SimpleString) and str(monitor.evaluated_value).startswith(
            "validation/"
        ):
            ctx.note(
                call.node,
                "evaluator",
                "info",
                "EarlyStoppingTrigger watches a validation key: the multi-node evaluator "
                "averages it, so every rank stops at the same epoch",
            )
            continue
        shown = ctx.code(monitor) if monitor is not None else "'main/loss' (the default)"
        ctx.note(
            call.node,
            "evaluator",
            "needs-person",
            f"EarlyStoppingTrigger monitors {shown}: every rank must see the same value or "
            "ranks stop at different epochs and the job hangs; monitor a 'validation/...' key",
        )


def _check_hand_written_evaluation(ctx: FileContext) -> None:
    """Without a Trainer there is no Evaluator to wrap: a loop over the scattered test set
    measures this rank's shard only."""
    if any(vocab.is_trainer(c.qname) for c in ctx.facts.calls):
        return
    for call in iterator_calls(ctx):
        if not is_training_iterator(call.node):
            ctx.note(
                call.node,
                "evaluator",
                "needs-person",
                "evaluation in a hand-written loop sees only this rank's shard of the test set: "
                "average the sums over ranks (comm.allreduce_obj) before printing them",
            )


@rewrite("evaluator", order=60, fixes=("MN505",), code="MN805")
def plan(ctx: FileContext) -> None:
    if ctx.options.data_parallel:
        _check_early_stopping(ctx)
        _check_hand_written_evaluation(ctx)
    if not ctx.options.data_parallel:
        return
    wrap = ctx.spell.top("create_multi_node_evaluator")
    own = {
        cls
        for cls, bases in ctx.facts.class_bases.items()
        if any(vocab.is_extension(b, "Evaluator") for b in bases)
    }
    for call in ctx.facts.calls:
        if not (vocab.is_extension(call.qname, "Evaluator") or call.qname in own):
            continue
        if vocab.is_multi_node_evaluator_factory(call.parent_qname):
            continue
        if ctx.suppressed(call.node, "evaluator"):
            continue
        comm = ctx.comm_at(call.func, "Evaluator")
        if comm is None:
            ctx.note(
                call.node,
                "evaluator",
                "needs-person",
                f"Evaluator built where the communicator cannot be passed: wrap it with {wrap}",
            )
            continue
        ctx.use_runtime()
        ctx.plan.replace_node(call.node, wrap_call(wrap, comm), call.stmt)
        ctx.note(call.node, "evaluator", "changed", f"Evaluator -> {wrap}(..., comm)")
