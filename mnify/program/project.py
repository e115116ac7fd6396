"""What the files of one program do with each other's code, for hazards that judge one file.

A hazard sees one file; whether what it finds there is really wrong can depend on the rest of
the program: a helper ``make_optimizer(model)`` returns a plain optimizer that ``train.py``
wraps with ``create_multi_node_optimizer``; ``net.py`` holds a plain BatchNormalization that
``train.py`` converts with ``create_mnbn_model``; ``mn.distribute_trainers(comm)`` converts a
Trainer's optimizer, iterator, evaluators and writers when it runs. :class:`ProjectUses` holds
these facts, read once from every file of the program (a single file is a program of one), so
each hazard decides itself whether another part of the program answers its finding
(``Rule.answered_elsewhere``, docs/design.md §1) and nothing after lint has to second-guess it.

Calls are matched by the last name of what they call, the way a reader matches them across
files without resolving imports.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

# the runtime call that converts every Trainer when it runs (mnify/runtime/trainers.py)
DISTRIBUTE_TRAINERS = "distribute_trainers"
DISTRIBUTE_EXTENSIONS = "distribute_extensions"
MULTI_NODE_OPTIMIZER = "create_multi_node_optimizer"
MNBN_MODEL = "create_mnbn_model"


@dataclass(frozen=True)
class ProjectUses:
    """How the program uses the functions and classes its files define (see the module doc)."""

    # some file calls ``distribute_trainers(trainer_or_comm, ...)``
    trainers_distributed_at_run_time: bool = False
    # some file calls ``create_mnbn_model``: BatchNormalization is converted where models are built
    batch_normalization_converted: bool = False
    # helpers whose result some file passes to ``create_multi_node_optimizer`` directly
    optimizer_helpers_wrapped: frozenset[str] = frozenset()
    # helpers some call of which is followed at once by ``distribute_extensions(trainer, comm)``
    extension_helpers_distributed: frozenset[str] = frozenset()
    # functions and methods every call of which runs on rank 0 only (``if <x>.rank == 0:``, or
    # ``f(...) if <x>.rank == 0 else None``)
    rank0_only_functions: frozenset[str] = frozenset()

    @classmethod
    def of_sources(cls, sources: Iterable[str]) -> ProjectUses:
        """The uses in these files' texts; a text that does not parse adds nothing."""
        trees = []
        for text in sources:
            try:
                trees.append(ast.parse(text))
            except (SyntaxError, ValueError):
                continue
        return cls.of_trees(trees)

    @classmethod
    def of_trees(cls, trees: Iterable[ast.Module]) -> ProjectUses:
        trees = list(trees)
        called = {name for tree in trees for name in _called_names(tree)}
        return cls(
            trainers_distributed_at_run_time=DISTRIBUTE_TRAINERS in called,
            batch_normalization_converted=MNBN_MODEL in called,
            optimizer_helpers_wrapped=frozenset(_wrapped_helpers(trees)),
            extension_helpers_distributed=frozenset(_helpers_followed_by_distribute(trees)),
            rank0_only_functions=frozenset(_called_on_rank0_only(trees)),
        )


def called_name(node: ast.AST) -> str | None:
    """The last name of the function a call (or a statement that is one) calls."""
    if isinstance(node, (ast.Expr, ast.Assign)):
        node = node.value
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _called_names(tree: ast.Module) -> Iterable[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = called_name(node)
            if name:
                yield name


def _wrapped_helpers(trees: list[ast.Module]) -> set[str]:
    """``create_multi_node_optimizer(make_optimizer(model), comm)`` -> ``make_optimizer``."""
    wrapped: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                if called_name(node) == MULTI_NODE_OPTIMIZER:
                    name = called_name(node.args[0])
                    if name:
                        wrapped.add(name)
    return wrapped


def _helpers_followed_by_distribute(trees: list[ast.Module]) -> set[str]:
    """``trainer = build_trainer(...)`` then ``distribute_extensions(trainer, comm)`` ->
    ``build_trainer``: the extensions the helper registers are distributed after it returns."""
    distributed: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            for part in ("body", "orelse", "finalbody"):
                body = getattr(node, part, None)
                if not isinstance(body, list):
                    continue
                for before, after in zip(body, body[1:], strict=False):
                    if called_name(after) == DISTRIBUTE_EXTENSIONS:
                        name = called_name(before)
                        if name:
                            distributed.add(name)
    return distributed


def _called_on_rank0_only(trees: list[ast.Module]) -> set[str]:
    """Functions and methods every call of which runs on rank 0 only: standing alone (a call or
    an assignment of its result) under ``if <x>.rank == 0:``, or the rank-0 side of ``f(...) if
    <x>.rank == 0 else None`` (how the converter broadcasts what a writing helper returns:
    ``comm.bcast_obj(load(...) if comm.rank == 0 else None)``). What they write is rank 0's."""
    anywhere: Counter[str] = Counter()
    on_rank0: Counter[str] = Counter()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = called_name(node)
                if name:
                    anywhere[name] += 1
            if isinstance(node, ast.If) and _is_rank0_test(node.test):
                for stmt in node.body:
                    name = called_name(stmt)
                    if name:
                        on_rank0[name] += 1
            elif isinstance(node, ast.IfExp) and _is_rank0_test(node.test):
                name = called_name(node.body)
                if name:
                    on_rank0[name] += 1
    return {name for name, count in on_rank0.items() if count == anywhere[name]}


def _is_rank0_test(test: ast.expr) -> bool:
    return ast.unparse(test).endswith(".rank == 0")
