"""Where the walk is in a script being linted: frames (module, functions, loops), the ``if``
branches around the current node, and whether it runs on only some ranks (inside a
rank-conditional ``if``, or after an early ``return``/``continue``/``break``/``sys.exit`` under
one). The program's walk calls ``enter`` before the rules see a node and ``leave`` after them.

The position half of ``LintContext`` (``meaning`` is the other); it records bindings as the
walk passes assignments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import libcst as cst

from mnify import vocabulary as N
from mnify.program.meaning import Binding, ExpressionMeaning
from mnify.syntax import dotted_name

FrameKind = Literal["module", "function", "loop"]


@dataclass
class Frame:
    """A function, loop or the module; ``exit_if`` is set once a rank-conditional early exit
    targets it, after which the rest of the frame runs on only some ranks."""

    node: cst.CSTNode
    kind: FrameKind
    rank_depth: int
    exit_if: cst.If | None = None
    exit_node: cst.CSTNode | None = None


class FlowPosition(ExpressionMeaning):
    """The walk's position, and the bookkeeping the walk does (state set up by ``LintContext``)."""

    frames: list[Frame]
    functions: list[cst.FunctionDef]
    branches: list[tuple[cst.If, str]]
    rank_branches: list[tuple[cst.If, str]]
    rank_ifs: dict[int, bool]
    loop_depth: int
    call_index: int
    _on_enter: dict[type[cst.CSTNode], Callable[[Any], None]]
    _on_leave: dict[type[cst.CSTNode], Callable[[Any], None]]

    # ------------------------------------------------------------------- flow position
    @property
    def function_frame(self) -> Frame:
        for frame in reversed(self.frames):
            if frame.kind != "loop":
                return frame
        raise RuntimeError("no module frame")  # the walk always enters the Module first

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
        self.functions.append(node)

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
