"""``mnify scale``'s probes inside each rank: where a step's time goes besides the collectives.

``mnify scale`` runs the script under ``mnify run`` with the timeline on and ``scale_updates=N``
in ``MNIFY_LAUNCH`` (:class:`mnify.environment.LaunchWiring`);
the bootstrap then calls :func:`start` before the script runs and compiles the script with
:func:`compile_script`. From then on, and only then, this rank's timeline also records

- each optimizer update as :mod:`mnify.runtime.update_watch` sees it (``step`` events), and the
  stop after the N-th (every rank stops after the same update);
- each ``next`` of a Chainer iterator (``data`` events, with the batch's length);
- each call of a Trainer extension (``extension`` events, named after the extension);
- each block of the script guarded by a rank-0 test (``if comm.rank == 0:``, ``if rank != 0:
  ... else:``): the compiled script times the block (``rank0`` events).

Without ``scale_updates`` nothing here is imported: no class is wrapped, the script is run as it
was written (``tests/scale`` checks both).
"""

from __future__ import annotations

import ast
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from mnify.runtime import timeline, update_watch
from mnify.runtime.timeline import NO_COMM, Category

RANK0_HOOK = "__mnify_rank0_work__"  # the name the compiled script calls its guarded blocks by

_started = False
_depth = 0  # inside a recorded span (nested iterators, a guarded block inside another)
_wrapped: list[tuple[type, str, Any]] = []  # (class, attribute, original) to restore


# -- recording --------------------------------------------------------------------------------


@contextlib.contextmanager
def _span(cat: Category, name: str, seq: int = 0) -> Iterator[list[int]]:
    """Record the block as one event (outermost only); ``aux`` is what the block stores in the
    list it is given (-1 by default)."""
    global _depth
    rec = timeline.recorder()
    aux = [-1]
    if rec is None or _depth:
        yield aux
        return
    _depth += 1
    start = rec.now()
    try:
        yield aux
    finally:
        _depth -= 1
        rec.add(cat, rec.name_id(name), NO_COMM, seq, rec.step, 0, aux[0], start, rec.now())


def rank0_work() -> contextlib.AbstractContextManager[list[int]]:
    """What the compiled script wraps each rank-0-guarded block in."""
    return _span(Category.RANK0, "rank 0 only")


# -- updates and the stop -----------------------------------------------------------------------


class _Steps:
    """``step`` events from update_watch: one per update, numbered from 1."""

    def __init__(self) -> None:
        self._start: dict[int, int] = {}

    def before_update(self, optimizer: Any, index: int) -> None:
        rec = timeline.recorder()
        if rec is not None:
            self._start[id(optimizer)] = rec.now()

    def after_update(self, optimizer: Any, index: int) -> None:
        rec = timeline.recorder()
        start = self._start.pop(id(optimizer), None)
        if rec is not None and start is not None:
            name = rec.name_id("update")
            rec.add(Category.STEP, name, NO_COMM, index, rec.step, 0, -1, start, rec.now())


# -- iterators ------------------------------------------------------------------------------------


def _timed_next(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def next_batch(self: Any) -> Any:
        if _depth:
            return original(self)
        with _span(Category.DATA, "next") as aux:
            batch = original(self)
            try:
                aux[0] = len(batch)
            except TypeError:
                pass
            return batch

    return next_batch


def _subclasses(base: type) -> list[type]:
    found, todo = [], [base]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def _wrap(cls: type, attribute: str, make: Callable[[Any], Any]) -> None:
    original = cls.__dict__.get(attribute)
    if original is None or getattr(original, "_mnify_scale", False):
        return
    wrapped = make(original)
    wrapped._mnify_scale = True
    _wrapped.append((cls, attribute, original))
    type.__setattr__(cls, attribute, wrapped)


def _hook_iterators() -> None:
    import chainer
    import chainer.iterators  # noqa: F401  (so that its classes are subclasses already)

    import mnify.runtime.iterators  # noqa: F401

    for cls in _subclasses(chainer.dataset.Iterator):
        for attribute in ("__next__", "next"):
            _wrap(cls, attribute, _timed_next)


# -- extensions -----------------------------------------------------------------------------------


class _TimedExtension:
    """An extension as the Trainer holds it: its calls recorded, everything else its own."""

    def __init__(self, extension: Any, name: str) -> None:
        self.__dict__["_extension"] = extension
        self.__dict__["_name"] = name

    def __call__(self, trainer: Any) -> Any:
        with _span(Category.EXTENSION, self._name):
            return self._extension(trainer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_extension"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._extension, name, value)


def _timed_extend(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def extend(self: Any, extension: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, extension, *args, **kwargs)
        name = getattr(extension, "name", None)
        entry = self._extensions.get(name) if isinstance(name, str) else None
        if isinstance(name, str) and entry is not None and entry.extension is extension:
            entry.extension = _TimedExtension(extension, name)
        return result

    return extend


def _hook_extensions() -> None:
    from chainer.training import Trainer

    _wrap(Trainer, "extend", _timed_extend)


# -- the script ---------------------------------------------------------------------------------


def _is_rank_zero_test(test: ast.expr) -> bool | None:
    """True: ``test`` holds on rank 0 only (``x.rank == 0``, ``rank == 0``, ``0 == x.rank``,
    ``... and x.rank == 0``); False: on every rank but 0 (``x.rank != 0``, ``x.rank > 0``,
    ``x.rank``); None: not a rank test."""

    def is_rank(node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr in ("rank", "intra_rank", "inter_rank")
        return isinstance(node, ast.Name) and node.id in ("rank", "intra_rank", "inter_rank")

    def is_zero(node: ast.expr) -> bool:
        return isinstance(node, ast.Constant) and node.value == 0 and node.value is not False

    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return True if any(_is_rank_zero_test(v) is True for v in test.values) else None
    if is_rank(test):
        return False  # truthy rank: not rank 0
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if is_zero(left):
            left, right = right, left
        if is_rank(left) and is_zero(right):
            if isinstance(op, ast.Eq):
                return True
            if isinstance(op, ast.NotEq | ast.Gt):
                return False
    return None


class _GuardTimer(ast.NodeTransformer):
    """Wrap the rank-0 branch of each rank test in ``with __mnify_rank0_work__():``."""

    def visit_If(self, node: ast.If) -> ast.AST:
        self.generic_visit(node)
        which = _is_rank_zero_test(node.test)
        if which is True:
            node.body = [_timed(node.body, node)]
        elif which is False and node.orelse:
            node.orelse = [_timed(node.orelse, node)]
        return node


def _timed(body: list[ast.stmt], where: ast.AST) -> ast.stmt:
    call = ast.Call(func=ast.Name(id=RANK0_HOOK, ctx=ast.Load()), args=[], keywords=[])
    block = ast.With(items=[ast.withitem(context_expr=call)], body=body)
    ast.copy_location(block, body[0] if body else where)
    return ast.fix_missing_locations(block)


def compile_script(path: str) -> Any:
    """The script's code with its rank-0-guarded blocks timed (line numbers unchanged)."""
    with open(path, "rb") as f:
        source = f.read()
    tree = ast.parse(source, filename=path)
    tree = _GuardTimer().visit(tree)
    return compile(tree, path, "exec", dont_inherit=True)


# -- on and off ---------------------------------------------------------------------------------


def start(updates: int) -> None:
    """Install the probes and ask for the stop after ``updates`` updates (once per process)."""
    global _started
    if _started:
        return
    _started = True
    _hook_iterators()
    _hook_extensions()
    update_watch.watch_updates(_Steps())
    update_watch.stop_after_updates(updates, "scale")


def installed() -> bool:
    """Whether any probe is installed (False unless :func:`start` ran)."""
    return bool(_wrapped) or _started
