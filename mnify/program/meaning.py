"""What expressions mean in a script being linted: the names they resolve to, the kind of value
a variable holds (communicator, multi-node optimizer, rank ...), which calls are collectives, and
the script-level facts (training script, distributed, model parallel).

The meaning half of ``LintContext`` (``flow`` is the position half). Bindings are tracked by
dotted name in source order, ignoring scopes: good enough for training scripts, and cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import libcst as cst
from libcst.metadata import QualifiedNameSource

from mnify import vocabulary as N
from mnify.syntax import argument, dotted_name, string_value, subexpressions

if TYPE_CHECKING:
    from mnify.program.effects import ProjectEffects

_LIBRARY_SOURCES = (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN)


@dataclass
class Binding:
    """The last value assigned to a dotted name, classified (see ``LintContext.classify``)."""

    kind: str | None
    value: cst.BaseExpression
    rank_conditional: bool
    scope: cst.CSTNode


class ExpressionMeaning:
    """Names, bindings and the meaning of expressions (state set up by ``LintContext``)."""

    path: str
    _qualified: Mapping[cst.CSTNode, Any]
    _name_cache: dict[int, frozenset[str]]
    bindings: dict[str, Binding]
    imported_modules: set[str]
    communicator_calls: list[cst.Call]
    model_parallel_uses: list[cst.CSTNode]
    class_names: set[str]
    external_collectives: Mapping[str, str]
    assume: str | None
    effects: ProjectEffects | None

    # ----------------------------------------------------------------- script-level facts
    @property
    def is_training_script(self) -> bool:
        """Imports chainer, chainermn, mnify.runtime, cupy or mpi4py (or a submodule): the files
        these rules are about."""
        return any(N.is_training_module(name) for name in self.imported_modules)

    @property
    def is_distributed(self) -> bool:
        """Creates a communicator (chainermn or mnify.runtime, any import style), or is taken
        to be part of a distributed program (``assume``)."""
        return bool(self.communicator_calls) or self.assume is not None

    @property
    def is_model_parallel(self) -> bool:
        return bool(self.model_parallel_uses) or self.assume == "model"

    @property
    def is_data_parallel(self) -> bool:
        """Distributed and not model parallel (no multi-node iterator/parallel links)."""
        return self.is_distributed and not self.is_model_parallel

    # ------------------------------------------------------------------- name resolution
    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        """Library names (imports and builtins) ``node`` resolves to; local names are left out."""
        key = id(node)
        cached = self._name_cache.get(key)
        if cached is not None:
            return cached
        raw = self._qualified.get(node)
        if callable(raw):
            raw = raw()
        result = frozenset(q.name for q in raw or () if q.source in _LIBRARY_SOURCES)
        self._name_cache[key] = result
        return result

    def callee_names(self, call: cst.Call) -> frozenset[str]:
        return self.qualified_names(call.func)

    def builds_optimizer(self, call: cst.Call) -> bool:
        """Whether ``call`` builds a Chainer optimizer: its callee resolves to one of
        ``chainer.optimizers``' classes, or to a class whose bases reach one of them or
        Chainer's optimizer base classes (``GradientMethod``), through the file's imports and
        definitions, the project's modules and the packages read from source (``effects``,
        mnify/program/effects.py: ``from optim import Adam`` where ``optim.Adam`` subclasses
        ``chainer.optimizers.Adam``). A class of the project that only has the name of one of
        Chainer's (its own ``SGD``, even where it shadows an imported one) is not. Without the
        program's effects (a text linted on its own) the qualified name decides."""
        made = self.made_by(call)
        if made is None:
            return any(N.is_optimizer(name) for name in self.callee_names(call))
        resolved, classes = made
        if classes == (resolved,):  # one of the fixed table's names itself
            return N.is_optimizer(resolved)
        return any(N.is_optimizer(c) or c in N.OPTIMIZER_BASES for c in classes)

    def made_by(self, call: cst.Call) -> tuple[str, tuple[str, ...]] | None:
        """What ``call``'s callee resolves to and the fixed table's classes it is or derives
        from (``ProjectEffects.made_by``); None when the program's effects cannot say."""
        callee = dotted_name(call.func)
        if self.effects is None or callee is None:
            return None
        return self.effects.made_by(self.path, callee)

    def binding(self, expr: cst.BaseExpression) -> Binding | None:
        name = dotted_name(expr)
        return None if name is None else self.bindings.get(name)

    def binding_kind(self, expr: cst.BaseExpression) -> str | None:
        found = self.binding(expr)
        return None if found is None else found.kind

    # -------------------------------------------------------------- expression meaning
    def is_communicator(self, expr: cst.BaseExpression) -> bool:
        """A communicator: bound to ``create_communicator``/``split``, ``MPI.COMM_WORLD``, or
        named like one (``comm``, ``self.comm``, ``communicator``, ``*_comm``)."""
        if self.binding_kind(expr) in ("communicator", "mpi_comm"):
            return True
        if isinstance(expr, cst.Name):
            return N.looks_like_communicator(expr.value)
        if isinstance(expr, cst.Attribute):
            return N.any_in(self.qualified_names(expr), N.MPI_WORLD) or N.looks_like_communicator(
                expr.attr.value
            )
        return False

    def is_sub_communicator(self, expr: cst.BaseExpression) -> bool:
        """Bound to ``comm.split(...)`` (or mpi4py's ``Split``/``Split_type``/``Create*``): its
        members are usually exactly the ranks that pass a matching rank check."""
        bound = self.binding(expr)
        if bound is None or not isinstance(bound.value, cst.Call):
            return False
        func = bound.value.func
        return isinstance(func, cst.Attribute) and func.attr.value in N.SPLIT_METHODS

    def rank_kind(self, expr: cst.CSTNode) -> str | None:
        """ "global", "intra" or "inter" when ``expr`` itself denotes a rank, else None."""
        if isinstance(expr, cst.Attribute):
            kind = N.RANK_ATTRIBUTES.get(expr.attr.value)
            if kind is not None and self.is_communicator(expr.value):
                return kind
            return None
        if isinstance(expr, cst.Name):
            bound = self.binding_kind(expr)
            if bound is not None and bound.startswith("rank:"):
                return bound[5:]
            return None
        if isinstance(expr, cst.Call):
            func = expr.func
            if isinstance(func, cst.Attribute) and func.attr.value == "Get_rank":
                return "global"
            names = self.callee_names(expr)
            if "os.getenv" in names or "os.environ.get" in names:
                key = string_value(argument(expr, 0, "key"))
                return None if key is None else N.env_rank_kind(key)
            return None
        if isinstance(expr, cst.Subscript) and "os.environ" in self.qualified_names(expr.value):
            element = expr.slice[0].slice if expr.slice else None
            if isinstance(element, cst.Index):
                key = string_value(element.value)
                return None if key is None else N.env_rank_kind(key)
        return None

    def find_rank(self, expr: cst.CSTNode, kinds: tuple[str, ...]) -> cst.CSTNode | None:
        """The first sub-expression of ``expr`` that is a rank of one of ``kinds``."""
        stack: list[cst.CSTNode] = [expr]
        while stack:
            node = stack.pop()
            kind = self.rank_kind(node)
            if kind is not None:
                if kind in kinds:
                    return node
                continue
            stack.extend(reversed(subexpressions(node)))
        return None

    def mentions_comm_size(self, expr: cst.CSTNode) -> bool:
        """``expr`` uses the number of ranks (``comm.size``, ``Get_size()``, a name bound to it)."""
        stack: list[cst.CSTNode] = [expr]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Attribute) and node.attr.value in N.SIZE_ATTRIBUTES:
                if self.is_communicator(node.value):
                    return True
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                if node.func.attr.value == "Get_size":
                    return True
            elif isinstance(node, cst.Name) and self.binding_kind(node) == "comm_size":
                return True
            stack.extend(subexpressions(node))
        return False

    def is_rank_condition(self, test: cst.BaseExpression) -> bool:
        """A test that mentions any rank (global, node-local or node index), except the
        always-true/always-false ``rank >= 0`` / ``rank < 0`` (a device id of -1 means CPU)."""
        if self._same_on_every_rank(test):
            return False
        return self.find_rank(test, ("global", "intra", "inter")) is not None

    def _same_on_every_rank(self, test: cst.BaseExpression) -> bool:
        if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
            return False
        target = test.comparisons[0]
        zero = isinstance(target.comparator, cst.Integer) and target.comparator.value == "0"
        return (
            zero
            and isinstance(target.operator, (cst.GreaterThanEqual, cst.LessThan))
            and self.rank_kind(test.left) is not None
        )

    def is_multi_node_evaluator(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Call):
            return N.any_in(self.callee_names(expr), N.MULTI_NODE_EVALUATOR_FACTORIES)
        return self.binding_kind(expr) == "mn_evaluator"

    def collective_key(self, call: cst.Call) -> str | None:
        """What collective ``call`` performs ("barrier", "bcast_obj", "optimizer.update" ...),
        or None when every rank need not call it together."""
        func = call.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in N.COLLECTIVE_METHODS and self.is_communicator(func.value):
                return method
            receiver = self.binding_kind(func.value)
            if method == "update" and receiver == "mn_optimizer":
                return "optimizer.update"
            if method == "evaluate" and receiver == "mn_evaluator":
                return "evaluator"
            if method == "run" and receiver == "trainer" and self.is_distributed:
                return "trainer.run"
            if (
                method == "extend"
                and call.args
                and self.is_multi_node_evaluator(call.args[0].value)
            ):
                return "trainer.extend(evaluator)"
        names = self.callee_names(call)
        if N.any_in(names, N.SCATTER_FUNCTIONS):
            return "scatter_dataset"
        for name in sorted(names):
            if name.lstrip(".") in N.GLOBAL_BATCH_COLLECTIVES:
                return N.GLOBAL_BATCH_COLLECTIVES[name.lstrip(".")]
        if N.any_in(names, N.COMMUNICATOR_FACTORIES):
            return "create_communicator"
        if isinstance(func, cst.Name) and self.binding_kind(func) == "mn_evaluator":
            return "evaluator"
        return None

    def external_collective(self, call: cst.Call) -> str | None:
        """``helper(...)`` of another file of the project that performs a collective: what it
        performs, spelled for a message (``helpers.load_data() (which calls scatter_dataset)``)."""
        if not self.external_collectives:
            return None
        for name in sorted(self.callee_names(call)):
            bare = name.lstrip(".")
            for qualified, what in self.external_collectives.items():
                if bare == qualified or bare.endswith("." + qualified):
                    return f"{qualified}() (which calls `{what}`)"
        return None

    def classify(self, value: cst.BaseExpression) -> str | None:
        """The kind of value an assignment binds; see ``Binding``."""
        if isinstance(value, cst.Call):
            names = self.callee_names(value)
            func = value.func
            if N.any_in(names, N.COMMUNICATOR_FACTORIES):
                return "communicator"
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in N.SPLIT_METHODS
                and self.is_communicator(func.value)
            ):
                return "communicator"
            if N.any_in(names, N.MULTI_NODE_OPTIMIZER_FACTORIES):
                return "mn_optimizer"
            if self.builds_optimizer(value):
                return "optimizer"
            if N.any_in(names, N.MULTI_NODE_EVALUATOR_FACTORIES):
                return "mn_evaluator"
            if N.any_is(names, N.is_evaluator):
                return "evaluator"
            if N.any_is(names, N.is_trainer):
                return "trainer"
            if N.any_in(names, N.DEVICE_GETTERS):
                return "device"
            if N.any_in(names, N.SCATTER_FUNCTIONS | N.EMPTY_DATASET_FACTORIES):
                return "scattered"
            if any(N.is_reporting_extension(n) for n in names):
                return "report_ext"
            if any(N.is_dataset_factory(n) for n in names):
                return "dataset"
        elif isinstance(value, cst.Name) and value.value == "None":
            return "none"
        elif isinstance(value, cst.Attribute) and N.any_in(
            self.qualified_names(value), N.MPI_WORLD
        ):
            return "mpi_comm"
        elif isinstance(value, cst.Subscript) and isinstance(value.value, cst.Call):
            inner = self.classify(value.value)
            if inner in ("dataset", "call"):
                return inner
        rank = self.find_rank(value, ("global", "inter", "intra"))
        if rank is not None:
            return f"rank:{self.rank_kind(rank)}"
        if self.mentions_comm_size(value):
            return "comm_size"
        if isinstance(value, cst.Call):
            return "call"
        return None
