"""Extensions that read a held-out dataset themselves keep the whole of it, on rank 0.

A BLEU- or accuracy-style extension of the user's (``trainer.extend(CalculateBleu(model,
test_data, ...))``) iterates over the dataset it holds. When the data step scatters that
dataset for the multi-node evaluator (``test = mn.scatter_dataset(test, comm)``), the extension
would score rank 0's shard and report it as the whole set. So rank 0 keeps a reference to the
whole dataset before it is scattered, the extension is built with it, and it runs on rank 0
only (its report goes to rank 0's LogReport)::

    test_whole = test
    test = mn.scatter_dataset(test, comm)
    ...
    if comm.rank == 0:
        trainer.extend(CalculateBleu(model, test_whole, ...))

Only extensions of the project (not Chainer's, not evaluators, which the evaluator step makes
multi-node) handed a scattered evaluation dataset by name, registered in the function that
scatters it.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import Guard, NodeFn, expression, statement
from mnify.rewrites.registry import rewrite

_STEP = "whole-set-extension"


def _scattered_for_evaluation(ctx: FileContext) -> dict[str, tuple[int, str]]:
    """Names the plan scatters without a shuffle (evaluation data) -> (key of the statement the
    scatter is inserted at, "before" or "after")."""
    found: dict[str, tuple[int, str]] = {}
    for where, table in (("before", ctx.plan.before), ("after", ctx.plan.after)):
        for key, stmts in table.items():
            for stmt in stmts:
                if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                    continue
                small = stmt.body[0]
                if not isinstance(small, cst.Assign) or not isinstance(small.value, cst.Call):
                    continue
                call, target = small.value, small.targets[0].target
                func = ctx.code(call.func)
                if not func.endswith("scatter_dataset") or not isinstance(target, cst.Name):
                    continue
                if any(a.keyword is not None and a.keyword.value == "shuffle" for a in call.args):
                    continue  # training data
                found[target.value] = (key, where)
    return found


def _is_user_extension(ctx: FileContext, qname: str) -> bool:
    """An extension class of the project: an ``Extension`` subclass of this file, or a class
    imported from another module that is not a library's (Chainer's and its family's), never an
    evaluator (the evaluator step makes those multi-node)."""
    bare = qname.lstrip(".")
    if not bare or bare.startswith(vocab.KNOWN_ROOTS) or bare in ctx.project_evaluators:
        return False
    if vocab.is_evaluator(bare) or vocab.is_evaluator_class(bare):
        return False
    if bare in ctx.facts.classes:
        bases = [vocab.last(b.lstrip(".")) for b in ctx.facts.class_bases.get(bare, ())]
        return any(b.endswith("Extension") for b in bases) and not any(
            b.endswith("Evaluator") for b in bases
        )
    return "." in bare


def _renamed(name: str) -> NodeFn:
    def fn(node: cst.CSTNode) -> cst.CSTNode:
        return expression(name)

    return fn


@rewrite(_STEP, order=36, code="MN816")
def plan(ctx: FileContext) -> None:
    if not ctx.options.data_parallel:
        return
    scattered = _scattered_for_evaluation(ctx)
    if not scattered:
        return
    copied: set[str] = set()
    for call in ctx.facts.calls:
        stmt = call.stmt
        if call.method != "extend" or not call.node.args or stmt is None:
            continue
        made = ctx.facts.call_of(call.node.args[0].value)
        if made is None or not _is_user_extension(ctx, made.qname):
            continue
        held = [
            a.value
            for a in made.node.args
            if isinstance(a.value, cst.Name) and a.value.value in scattered
        ]
        if not held or ctx.suppressed(stmt, _STEP) or ctx.on_rank0_already(stmt):
            continue
        comm = ctx.comm_at(call.func, _STEP)
        if comm is None:
            continue
        for name in held:
            whole = f"{name.value}_whole"
            if ctx.facts.assigns_of(whole):
                break  # a name of the script's own: leave it to a person
            if name.value not in copied:
                key, where = scattered[name.value]
                anchor = ctx.plan.nodes[key]
                assert isinstance(anchor, cst.BaseStatement)
                copy = [statement(f"{whole} = {name.value}\n")]
                if where == "before":
                    ctx.plan.insert_before(anchor, copy, first=True)
                else:
                    ctx.plan.insert_after(anchor, copy, first=True)
                copied.add(name.value)
            ctx.plan.replace_node(name, _renamed(whole), stmt)
        else:
            ctx.plan.guard_stmt(stmt, Guard("rank0"))
            names = ", ".join(n.value for n in held)
            ctx.note(
                stmt,
                _STEP,
                "changed",
                f"{vocab.last(made.qname)} reads {names} itself, which is scattered for the "
                f"evaluator: it is built with the whole set ({names}_whole, rank 0's) and runs on "
                "rank 0 only, so its score covers the whole set",
                claim=("guarded", stmt),
            )
