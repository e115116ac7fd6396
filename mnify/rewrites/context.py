"""Per-file state the rewrites write: the edit plan, the report, and comm access, over the
read-only :class:`~mnify.rewrites.source_file.SourceFile` (facts, lines, ``# noqa``).

``comm_at`` answers the question every rewrite asks before emitting ``comm``: can code at this
spot see the communicator? Inside the training entry point it can. In a module-level helper
function or a model class's ``__init__`` it cannot, so the helper/class gains a keyword-only
``comm`` parameter and its call sites pass ``comm=comm`` (threading, finished by
:meth:`FileContext.thread_calls` once every file of a conversion has been planned).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import libcst as cst

from mnify.rewrites.edits import EditPlan
from mnify.rewrites.options import Spelling
from mnify.rewrites.report import Claim, FileReport, ReportEntry, Severity
from mnify.rewrites.source_file import SourceFile
from mnify.rewrites.step_codes import step_code
from mnify.syntax import names_in

if TYPE_CHECKING:
    from mnify.rewrites.device import DeviceSource

LiftKind = Literal[
    "optimizer",
    "mnbn",
    "rank0",
    "rank0-result",  # a helper that writes and returns what it made (helper_writes)
    "rank0-method",  # a method of the user's class that only writes (helper_writes)
    "loop-data",  # arrays a training function's hand-written loop indexes (loops)
    "channel-parallel",
    "spatial-parallel",
    "extensions",
]


@dataclass(eq=False)
class Lift:
    """Work a helper or model class cannot do without ``comm``, done where it is called:
    wrap the call (``optimizer``: create_multi_node_optimizer; ``mnbn``: create_mnbn_model;
    ``channel-parallel``: split its convolutions; ``spatial-parallel``: split its activations
    into slabs of rows), guard the calling statement (``rank0``), or
    convert the trainer it registered extensions on (``extensions``: distribute_extensions)."""

    name: str  # the module-level function or class
    kind: LiftKind
    label: str  # what inside it needs comm, for messages
    node: cst.CSTNode  # where, for the report
    module: str  # the module that defines it
    param: tuple[int, str] | None = None  # extensions: (position, name) of the trainer parameter


@dataclass(eq=False)
class Entry:
    """Where the training entry point is and what the communicator is called there."""

    func: cst.FunctionDef | None  # None: module level
    comm: str = "comm"
    exists: bool = False  # the file already creates a communicator (converted before)
    creation: cst.BaseStatement | None = None  # ... in this statement
    anchor: cst.BaseStatement | None = None  # comm goes right after this statement
    top_of: cst.FunctionDef | None = None  # ... or at the top of this function's body
    args: str | None = None  # the argparse namespace variable
    device_dest: str | None = None
    device_style: str | None = None  # int | str | flag
    # a device chosen in the code, no flag (``gpu = -1``, ``settings["gpu"]`` of a config it
    # loads): the communicator is created once it is set, picks pure_nccl or the CPU one from it
    # at run time and re-points it to the rank's GPU (``device.find_source``)
    device_source: DeviceSource | None = None


@dataclass(eq=False)
class FileContext(SourceFile):
    """A file being converted: the read-only :class:`SourceFile` and what the rewrites write:
    the edit plan, the report (:class:`~mnify.rewrites.report.FileReport`), and the state the
    project's other files read (the entry point, the work for other files: ``lifts``)."""

    plan: EditPlan = field(default_factory=EditPlan)
    report: FileReport = field(default_factory=FileReport)
    entry: Entry | None = None
    comm_needed: bool = False
    lifts: list[Lift] = field(default_factory=list)  # work for the callers of helpers/classes
    writing_extensions: set[str] = field(default_factory=set)  # this file's, by name
    imports_needed: set[str] = field(default_factory=set)
    # statements to insert before the communicator (the forkserver preamble)
    preamble: list[cst.BaseStatement] = field(default_factory=list)
    # module-level training helpers the entry point calls, which fetch the communicator with
    # current_communicator() (id -> function); those whose code was given comm
    _training_helpers: dict[int, cst.FunctionDef] | None = None
    helpers_given_comm: dict[int, cst.FunctionDef] = field(default_factory=dict)
    # the communicator is followed by mn.distribute_trainers(comm) (training out of reach)
    distribute_trainers: bool = False
    _early_helpers: list[cst.FunctionDef | cst.ClassDef] | None = None

    @property
    def runtime(self) -> Spelling:
        """The spelling of runtime names, noting that the file now needs the runtime import."""
        self.use_runtime()
        return self.spell

    def use_runtime(self) -> None:
        self.imports_needed.add(self.spell.import_line)

    # report and comm access -------------------------------------------------------------
    def note(
        self,
        node: cst.CSTNode | None,
        step: str,
        severity: Severity,
        message: str,
        code: str | None = None,
        claim: Claim | None = None,
        facts: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """A report entry, filed under ``code`` or else the step's rule code. ``claim`` says what
        the output must show for the entry to be true; the driver checks it on the output.
        ``facts``: the entry's machine-readable content (see ``ReportEntry.facts``)."""
        line = self.line(node) if node is not None else 1
        entry = ReportEntry(
            self.path, line, step, severity, message, code or step_code(step), facts
        )
        self.report.add(entry, claim)

    def visible(self, func: cst.FunctionDef | None) -> bool:
        """Whether code in ``func`` sees the entry point's communicator without threading: in
        the entry point, or in a training helper it calls (:meth:`training_helper`)."""
        return self._in_entry(func) or self.training_helper(func) is not None

    def _in_entry(self, func: cst.FunctionDef | None) -> bool:
        entry = self.entry
        if entry is None:
            return False
        if entry.func is None:
            # A module-level script's functions read the global comm: only those it never
            # calls before creating it (a banner() printed above parse_args() cannot).
            return func is None or self._outermost(func) not in self._called_before_comm()
        return func is not None and self._inside(func, entry.func)

    def _called_before_comm(self) -> list[cst.FunctionDef | cst.ClassDef]:
        """Module-level functions a module-level script calls before its communicator exists."""
        if self._early_helpers is not None:
            return self._early_helpers
        found: list[cst.FunctionDef | cst.ClassDef] = []
        for call in self.facts.calls:
            if call.func is not None or call.stmt is None:
                continue
            helper = self.facts.module_functions.get(call.qname.lstrip("."))
            if helper is not None and helper not in found and self.before_comm_exists(call.stmt):
                found.append(helper)
        self._early_helpers = found
        return found

    def training_helper(self, func: cst.FunctionDef | None) -> cst.FunctionDef | None:
        """The module-level helper around ``func`` when it is one the entry point calls to
        train (it builds an optimizer it does not hand back, so no wrapping at its call can make
        it data-parallel). Such a helper keeps its signature and gets the communicator with
        ``comm = mn.current_communicator()`` as its first statement."""
        if func is None or self.entry is None:
            return None  # asked before the entry point is known: nothing to cache yet
        if self._training_helpers is None:
            self._training_helpers = self._find_training_helpers()
        scope = self._outermost(func)
        if isinstance(scope, cst.FunctionDef):
            return self._training_helpers.get(id(scope))
        method: object = func
        while method is not None and self.facts.func_parent.get(id(method)) is not scope:
            method = self.facts.func_parent.get(id(method))
        return self._training_helpers.get(id(method)) if method is not None else None

    def _find_training_helpers(self) -> dict[int, cst.FunctionDef]:
        entry = self.entry
        if entry is None or self.options.target != "mnify" or not self.options.data_parallel:
            return {}
        found: dict[int, cst.FunctionDef] = {}
        for name, helper in self.facts.module_functions.items():
            if helper is entry.func or self.facts.func_class.get(id(helper)) is not None:
                continue
            mine = [
                c for c in self.facts.calls if c.func is not None and self._inside(c.func, helper)
            ]
            trains = any(
                self.builds_optimizer(c) and not self.returns_value_of(helper, c.node) for c in mine
            )
            called = any(
                c.qname.lstrip(".") == name and self._in_entry(c.func) for c in self.facts.calls
            )
            if trains and called and entry.comm not in names_in([helper]):
                found[id(helper)] = helper
        for name, cls in self.facts.classes.items():
            for method in self._methods_keeping_an_optimizer(cls):
                built = [
                    c
                    for c in self.facts.calls
                    if c.qname.lstrip(".") == name and c.stmt is not None and self._in_entry(c.func)
                ]
                if (
                    built
                    and not any(self.before_comm_exists(c.stmt) for c in built if c.stmt)
                    and entry.comm not in names_in([method])
                ):
                    found[id(method)] = method
        return found

    def _methods_keeping_an_optimizer(self, cls: cst.ClassDef) -> list[cst.FunctionDef]:
        """Methods of a module-level class that build an optimizer and keep it (on ``self``)
        rather than return it: a training class (``Runner(model, lr)`` whose ``__init__`` sets
        ``self.opt = SGD(lr)`` and whose ``step`` updates it), built by the entry point. Such a
        method takes the entry point's communicator with ``mn.current_communicator()``."""
        found: list[cst.FunctionDef] = []
        for c in self.facts.calls:
            method = c.func
            if (
                method is None
                or self.facts.func_class.get(id(method)) is not cls
                or method in found
                or not self.builds_optimizer(c)
                or self.returns_value_of(method, c.node)
            ):
                continue
            found.append(method)
        return found

    def under_rank0_guard(self, stmt: cst.BaseStatement) -> bool:
        """The plan puts ``stmt``, or a statement of its function holding it, under
        ``if comm.rank == 0:``."""
        current: cst.BaseStatement | None = stmt
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.ClassDef)):
            if self.plan.is_guarded(current):
                return True
            current = self.facts.parent_statement(current)
        return False

    def comm_at(self, func: cst.FunctionDef | None, why: str) -> str | None:
        """The expression naming the communicator at code inside ``func`` (None: module level),
        or None where the communicator is not in scope. No rewrite ever adds a ``comm``
        parameter to reach further (docs/design.md §0): what needs ``comm`` outside the entry point is
        lifted to the calls of the enclosing helper or class (:meth:`lift`). ``why`` names
        the construct, for messages."""
        if self.visible(func):
            self.comm_needed = True
            assert self.entry is not None
            helper = self.training_helper(func)
            if helper is not None:
                self.helpers_given_comm[id(helper)] = helper
            return self.entry.comm
        return None

    def withdraw_guard(self, stmt: cst.BaseStatement) -> None:
        """Take back a planned rank-0 guard, and what the report said about it."""
        if not self.plan.is_guarded(stmt):
            return
        self.plan.unguard(stmt)
        self.report.withdraw_claims_on(stmt)

    def before_comm_exists(self, stmt: cst.BaseStatement) -> bool:
        """``stmt`` runs before ``comm`` is bound in the same function: before the script's own
        ``comm = create_communicator(...)``, or at or before the statement the converter puts
        the communicator after (a guard there would read ``comm`` before it is bound)."""
        entry = self.entry
        if entry is None:
            return False
        if entry.exists:
            if entry.creation is None:
                return False
            where, inclusive = entry.creation, False
        elif entry.anchor is not None:
            where, inclusive = entry.anchor, True  # the new comm goes right after the anchor
        else:
            return False
        block = self.facts.block_of.get(id(where))
        if block is None:
            return False
        siblings = list(block.body)
        current: cst.BaseStatement | None = stmt
        while current is not None:
            if any(s is current for s in siblings):
                here, there = siblings.index(current), siblings.index(where)
                return here <= there if inclusive else here < there
            current = self.facts.parent_statement(current)
        return False

    def on_rank0_already(self, stmt: cst.BaseStatement) -> bool:
        """Under ``if comm.rank == 0:`` in the input, or inside a statement already planned to
        be guarded (a guard inside a guard says nothing)."""
        if id(stmt) in self.facts.under_rank0:
            return True
        parent = self.facts.parent_statement(stmt)
        while parent is not None:
            if self.plan.is_guarded(parent):
                return True
            parent = self.facts.parent_statement(parent)
        return False

    def lift(
        self,
        func: cst.FunctionDef | None,
        kind: LiftKind,
        label: str,
        node: cst.CSTNode,
        param: tuple[int, str] | None = None,
    ) -> bool:
        """Ask for ``kind`` to be done where the module-level helper or class enclosing
        ``func`` is called from the entry point (see ``call_sites``). Returns False when there
        is no such helper (code at module level, or nested where nothing can be lifted)."""
        scope = self.outermost_scope(func)
        if scope is None:
            return False
        if isinstance(scope, cst.ClassDef) and kind == "rank0":
            return False  # a method's writes cannot be moved to the class's construction
        name = scope.name.value
        for lift in self.lifts:
            if (lift.name, lift.kind, lift.module) == (name, kind, self.module_name):
                if label not in lift.label.split(" or "):
                    lift.label = f"{lift.label} or {label}"  # built by if/elif on a name
                return True
        self.lifts.append(Lift(name, kind, label, node, self.module_name, param))
        return True

    def trainer_parameter(
        self, func: cst.FunctionDef | None, receiver: str | None
    ) -> tuple[int, str] | None:
        """``(position, name)`` when ``receiver`` is a parameter of ``func``, a module-level
        helper (``def add_extensions(trainer, ...)``): where its callers pass the trainer."""
        if func is None or receiver is None or self.outermost_scope(func) is not func:
            return None
        if self.facts.func_class.get(id(func)) is not None:
            return None
        for i, param in enumerate(func.params.params):
            if param.name.value == receiver:
                return i, receiver
        for param in func.params.kwonly_params:
            if param.name.value == receiver:
                return -1, receiver
        return None
