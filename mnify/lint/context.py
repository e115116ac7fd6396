"""What every rule needs to know about the script being linted, computed once per file.

``LintContext`` follows the single traversal the runner makes (the runner calls ``enter`` before
the rules see a node and ``leave`` after them). It answers, at any point of that walk:
what a name resolves to (through one shared ``QualifiedNameProvider`` resolution), what kind of
value a variable holds (communicator, multi-node optimizer, device, global rank ...), whether the
current statement runs on only some ranks (inside a rank-conditional ``if``, or after an early
``return``/``continue``/``break``/``sys.exit`` under one), and which script-level facts hold
(training script, distributed, model parallel). Bindings are tracked by dotted name in source
order, ignoring scopes: good enough for training scripts, and cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import libcst as cst
from libcst.metadata import QualifiedNameSource

from mnify import vocabulary as N

FrameKind = Literal["module", "function", "loop"]
_LIBRARY_SOURCES = (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN)


@dataclass
class Binding:
    """The last value assigned to a dotted name, classified (see ``LintContext.classify``)."""

    kind: str | None
    value: cst.BaseExpression
    rank_conditional: bool
    scope: cst.CSTNode


@dataclass
class Frame:
    """A function, loop or the module; ``exit_if`` is set once a rank-conditional early exit
    targets it, after which the rest of the frame runs on only some ranks."""

    node: cst.CSTNode
    kind: FrameKind
    rank_depth: int
    exit_if: cst.If | None = None
    exit_node: cst.CSTNode | None = None


def dotted_name(expr: cst.BaseExpression) -> str | None:
    """``self.comm`` -> "self.comm"; anything that is not a Name/Attribute chain -> None."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = dotted_name(expr.value)
        return None if base is None else f"{base}.{expr.attr.value}"
    return None


_LEAVES = (cst.Name, cst.BaseNumber, cst.SimpleString, cst.Ellipsis)


def subexpressions(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The direct sub-expressions of an expression, in source order: a fast path for the
    common node types (``CSTNode.children`` re-visits the node to collect them, with
    whitespace and punctuation), falling back to ``children`` for the rest."""
    if isinstance(node, _LEAVES):
        return []
    if isinstance(node, cst.Attribute):
        return [node.value]
    if isinstance(node, cst.Call):
        return [node.func, *(arg.value for arg in node.args)]
    if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
        return [node.left, node.right]
    if isinstance(node, cst.Comparison):
        return [node.left, *(target.comparator for target in node.comparisons)]
    if isinstance(node, cst.UnaryOperation):
        return [node.expression]
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return [element.value for element in node.elements]
    if isinstance(node, cst.IfExp):
        return [node.test, node.body, node.orelse]
    if isinstance(node, cst.Subscript):
        found: list[cst.CSTNode] = [node.value]
        for element in node.slice:
            if isinstance(element.slice, cst.Index):
                found.append(element.slice.value)
        return found
    return list(node.children)


def string_value(expr: cst.BaseExpression | None) -> str | None:
    """The value of a plain string literal, else None."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def argument(call: cst.Call, position: int, *keywords: str) -> cst.BaseExpression | None:
    """The expression passed as positional ``position`` or as one of ``keywords``."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in keywords:
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if 0 <= position < len(positional):
        return positional[position].value
    return None


class LintContext:
    """Shared, incrementally built knowledge about one file (see the module docstring)."""

    def __init__(self, path: str, qualified_names: Mapping[cst.CSTNode, Any]) -> None:
        self.path = path
        self._qualified = qualified_names
        self._name_cache: dict[int, frozenset[str]] = {}
        self.bindings: dict[str, Binding] = {}
        self.imported_modules: set[str] = set()  # dotted names, `from a import b` adds a.b
        self.communicator_calls: list[cst.Call] = []
        self.model_parallel_uses: list[cst.CSTNode] = []
        self.class_names: set[str] = set()  # classes defined in this file (models, datasets)
        self.frames: list[Frame] = []
        self.branches: list[tuple[cst.If, str]] = []
        self.rank_branches: list[tuple[cst.If, str]] = []
        self.rank_ifs: dict[int, bool] = {}
        self.loop_depth = 0
        self.call_index = 0
        # functions of other files of the project that perform a collective:
        # qualified name ("helpers.load_data") -> the collective ("scatter_dataset")
        self.external_collectives: Mapping[str, str] = {}
        # "data" / "model": judge the file as part of a data- / model-parallel program even
        # if it creates no communicator itself (the converter's view of its input and output)
        self.assume: str | None = None
        # node type -> handler; a dict lookup per node keeps the shared walk cheap
        self._on_enter: dict[type[cst.CSTNode], Callable[[Any], None]] = {
            cst.Call: self._enter_call,
            cst.If: self._enter_if,
            cst.For: self._enter_loop,
            cst.While: self._enter_loop,
            cst.FunctionDef: self._enter_function,
            cst.ClassDef: self._enter_class,
            cst.Return: self._enter_return,
            cst.Continue: self._enter_loop_exit,
            cst.Break: self._enter_loop_exit,
            cst.Module: self._enter_module,
            cst.Import: self._enter_import,
            cst.ImportFrom: self._enter_import_from,
        }
        self._on_leave: dict[type[cst.CSTNode], Callable[[Any], None]] = {
            cst.Assign: self._leave_assign,
            cst.AnnAssign: self._leave_ann_assign,
            cst.For: self._leave_loop,
            cst.While: self._leave_loop,
            cst.FunctionDef: self._leave_function,
        }

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
            if any(N.is_optimizer(n) for n in names):
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

    # ------------------------------------------------------------------- flow position
    @property
    def function_frame(self) -> Frame:
        for frame in reversed(self.frames):
            if frame.kind != "loop":
                return frame
        raise RuntimeError("no module frame")  # the runner always enters the Module first

    @property
    def scope_node(self) -> cst.CSTNode:
        """The function (or module) whose body is being walked."""
        return self.function_frame.node

    def rank_if(self) -> cst.If | None:
        """The innermost rank-conditional ``if`` around this point, within the current function."""
        if len(self.rank_branches) > self.function_frame.rank_depth:
            return self.rank_branches[-1][0]
        return None

    def divergent_exit(self) -> Frame | None:
        """The frame whose rank-conditional early exit this point follows, if any."""
        for frame in reversed(self.frames):
            if frame.exit_if is not None:
                return frame
            if frame.kind != "loop":
                return None
        return None

    def on_some_ranks(self) -> bool:
        """This point runs on only some ranks (rank-conditional branch or after an early exit)."""
        return self.rank_if() is not None or self.divergent_exit() is not None

    def branch_path(self) -> tuple[tuple[int, str], ...]:
        """The ``if`` branches enclosing this point (to tell mutually exclusive branches apart)."""
        return tuple((id(node), attr) for node, attr in self.branches)

    def is_rank_if(self, node: cst.If) -> bool:
        return self.rank_ifs.get(id(node), False)

    # --------------------------------------------------------------- runner callbacks
    def enter(self, node: cst.CSTNode) -> None:
        handler = self._on_enter.get(type(node))
        if handler is not None:
            handler(node)

    def leave(self, node: cst.CSTNode) -> None:
        handler = self._on_leave.get(type(node))
        if handler is not None:
            handler(node)

    def _enter_if(self, node: cst.If) -> None:
        self.rank_ifs[id(node)] = self.is_rank_condition(node.test)

    def _enter_loop(self, node: cst.For | cst.While) -> None:
        self.frames.append(Frame(node, "loop", len(self.rank_branches)))
        self.loop_depth += 1

    def _leave_loop(self, node: cst.For | cst.While) -> None:
        self.frames.pop()
        self.loop_depth -= 1

    def _enter_function(self, node: cst.FunctionDef) -> None:
        self.frames.append(Frame(node, "function", len(self.rank_branches)))

    def _leave_function(self, node: cst.FunctionDef) -> None:
        self.frames.pop()

    def _enter_module(self, node: cst.Module) -> None:
        self.frames.append(Frame(node, "module", 0))

    def _enter_class(self, node: cst.ClassDef) -> None:
        self.class_names.add(node.name.value)
        for base in node.bases:
            if N.any_in(self.qualified_names(base.value), N.MODEL_PARALLEL_MARKERS):
                self.model_parallel_uses.append(base)

    def _enter_return(self, node: cst.Return) -> None:
        self._early_exit(node, "function")

    def _enter_loop_exit(self, node: cst.Continue | cst.Break) -> None:
        self._early_exit(node, "loop")

    def _enter_import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted_name(alias.name)
            if name:
                self.imported_modules.add(name)

    def _enter_import_from(self, node: cst.ImportFrom) -> None:
        module = dotted_name(node.module) if node.module is not None else None
        if not module or node.relative:
            return
        self.imported_modules.add(module)
        if not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                name = dotted_name(alias.name)
                if name:
                    self.imported_modules.add(f"{module}.{name}")

    def _leave_assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def _leave_ann_assign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)

    def enter_branch(self, node: cst.If, attribute: str) -> None:
        self.branches.append((node, attribute))
        if self.rank_ifs.get(id(node)):
            self.rank_branches.append((node, attribute))

    def leave_branch(self, node: cst.If) -> None:
        self.branches.pop()
        if self.rank_ifs.get(id(node)):
            self.rank_branches.pop()

    # ------------------------------------------------------------------------ helpers
    def _enter_call(self, call: cst.Call) -> None:
        self.call_index += 1
        names = self.callee_names(call)
        if not names:
            return
        if N.any_in(names, N.COMMUNICATOR_FACTORIES):
            self.communicator_calls.append(call)
        elif N.any_in(names, N.MODEL_PARALLEL_MARKERS):
            self.model_parallel_uses.append(call)
        elif N.any_in(names, N.PROCESS_EXITS):
            self._early_exit(call, "function")

    def _early_exit(self, node: cst.CSTNode, target: FrameKind) -> None:
        rank_if = self.rank_if()
        if rank_if is None:
            return
        for frame in reversed(self.frames):
            if target == "loop" and frame.kind != "loop":
                return  # continue/break outside a loop of this function: nothing to mark
            if frame.kind == target or (target == "function" and frame.kind == "module"):
                if frame.rank_depth < len(self.rank_branches) and frame.exit_if is None:
                    frame.exit_if = rank_if
                    frame.exit_node = node
                return

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            values: list[cst.BaseExpression] | None = None
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(
                target.elements
            ):
                values = [e.value for e in value.elements]
            for index, element in enumerate(target.elements):
                self._bind(element.value, value if values is None else values[index])
            return
        name = dotted_name(target)
        if name is None:
            return
        self.bindings[name] = Binding(
            self.classify(value), value, self.rank_if() is not None, self.scope_node
        )
