"""What every rule needs to know about the script being linted, computed once per file.

``LintContext`` follows the program's one walk (mnify/program/walk.py calls ``enter`` before
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
from typing import Any

import libcst as cst

from mnify.program.effects import ProjectEffects
from mnify.program.flow import FlowPosition, Frame
from mnify.program.meaning import Binding
from mnify.program.project import ProjectUses


class LintContext(FlowPosition):
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
        self.functions: list[cst.FunctionDef] = []  # every function entered, in source order
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
        # what the other files of the program (and this one) do with this file's code
        self.project = ProjectUses()
        # what the program's names resolve to (classes through their bases): which calls build
        # an optimizer (``builds_optimizer``); None for a text linted on its own
        self.effects: ProjectEffects | None = None
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
