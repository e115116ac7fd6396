"""Datasets every rank builds and slices by index instead of receiving rank 0's (issue 31, item 4).

The dataset step (``rewrites/dataset.py``) lets rank 0 load a dataset and scatters it: the other
ranks unpickle their share. That is wrong or wasteful for datasets that

* **load with side effects the other ranks need**: a loading function (of the file, through any
  of its functions) that inserts into ``sys.path`` and imports a module by name, then builds the
  dataset from a class of that module. Rank 1 never ran the import, so unpickling rank 0's share
  fails (``ModuleNotFoundError``);
* **only load lazily**: Chainer's datasets that read a file when indexed (``LabeledImageDataset``,
  ``ImageDataset`` ...), a ``DatasetMixin`` of the file whose ``get_example`` reads files, a list
  of paths (``glob``, ``os.listdir``): building one costs nothing, so every rank builds it;
* **transform** (``TransformDataset``): its transform may hold a model or other unpicklable state.

Every rank then builds the dataset as the script does and keeps its own contiguous slice by index
(``chainer.datasets.SubDataset(d, *mn.scatter_index(len(d), comm))``): nothing is pickled.

"Changes imports" is a local, file-level query here; ``mnify/program/effects.py`` (the
``imports`` effect) answers it across the project and should replace it once it is the project's.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites.source_file import SourceFile

_PATH_LISTS = frozenset({"glob.glob", "glob.iglob", "os.listdir", "os.scandir"})
_READERS = frozenset({"open", "load", "imread", "read_image", "loadtxt", "read", "fromfile"})


def kept_by_index(
    ctx: SourceFile, name: str, body: Sequence[cst.BaseStatement], defs: list[int]
) -> str | None:
    """Why every rank builds ``name`` and keeps its slice by index (a phrase for the report,
    after the dataset's name), or None when rank 0's copy can be scattered. ``defs``: indices in
    ``body`` of the statements that bind the datasets loaded with it."""
    last = _last_value(ctx, name, body, defs)
    made = ctx.facts.call_of(last)
    if made is not None:
        if vocab.is_transform_dataset(made.qname):
            return "is a TransformDataset (its transform may hold a model)"
        if vocab.is_lazy_dataset(made.qname):
            return f"is a {vocab.last(made.qname)} (it reads its files when indexed)"
        if _reads_when_indexed(ctx, made):
            return f"is a {made.qname.lstrip('.')} that reads its files when indexed"
    if last is not None and _is_path_list(ctx, last):
        return "is a list of paths"
    seen: set[int] = set()
    for i in defs:
        stmt = body[i]
        if name in _bound_by(ctx, stmt) and _changes_imports(ctx, stmt, seen):
            return (
                "is loaded by code that changes sys.path or imports a module by name (the other "
                "ranks could not unpickle what rank 0 sent)"
            )
    return None


def _bound_by(ctx: SourceFile, stmt: cst.BaseStatement) -> set[str]:
    ids = {id(stmt)}
    return {
        t
        for a in ctx.facts.assigns
        if a.stmt is not None and _within(ctx, a.stmt, stmt, ids)
        for t in a.targets
    }


def _within(
    ctx: SourceFile, stmt: cst.BaseStatement, outer: cst.BaseStatement, ids: set[int]
) -> bool:
    current: cst.BaseStatement | None = stmt
    while current is not None:
        if id(current) in ids:
            return True
        current = ctx.facts.parent_statement(current)
    return False


def _last_value(
    ctx: SourceFile, name: str, body: Sequence[cst.BaseStatement], defs: list[int]
) -> cst.BaseExpression | None:
    """The value the last defining statement binds to ``name`` (a plain assignment)."""
    for i in reversed(defs):
        for a in ctx.facts.assigns_of(name):
            if a.stmt is body[i] and isinstance(a.node, cst.Assign) and a.targets == (name,):
                return a.value
    return None


def _reads_when_indexed(ctx: SourceFile, made: CallFact) -> bool:
    """A ``DatasetMixin`` class of the file whose ``get_example`` reads a file."""
    bare = made.qname.lstrip(".").rsplit(".", 1)[-1]
    cls = ctx.facts.classes.get(bare)
    if cls is None or not any(vocab.is_dataset_mixin(b) for b in ctx.facts.class_bases[bare]):
        return False
    getters = [
        s
        for s in (cls.body.body if isinstance(cls.body, cst.IndentedBlock) else [])
        if isinstance(s, cst.FunctionDef) and s.name.value == "get_example"
    ]
    return any(
        c.func is getter and vocab.last(c.qname) in _READERS
        for getter in getters
        for c in ctx.facts.calls
    )


def _is_path_list(ctx: SourceFile, value: cst.BaseExpression) -> bool:
    """``glob.glob(...)``, ``sorted(os.listdir(d))``, a comprehension over one."""
    if isinstance(value, (cst.ListComp, cst.GeneratorExp)):
        return _is_path_list(ctx, value.for_in.iter)
    made = ctx.facts.call_of(value)
    if made is None:
        return False
    if made.qname in _PATH_LISTS:
        return True
    if made.qname in ("sorted", "builtins.sorted", "list", "builtins.list") and made.node.args:
        return _is_path_list(ctx, made.node.args[0].value)
    return False


def _changes_imports(ctx: SourceFile, stmt: cst.CSTNode, seen: set[int]) -> bool:
    """Whether running ``stmt`` (a statement, or a function of the file) changes ``sys.path``
    or imports a module by name, through any function of the file it calls."""
    if id(stmt) in seen:
        return False
    seen.add(id(stmt))
    if isinstance(stmt, cst.FunctionDef):
        calls = [c for c in ctx.facts.calls if c.func is not None and _in_function(ctx, c, stmt)]
    else:
        assert isinstance(stmt, cst.BaseStatement)
        calls = [
            c
            for c in ctx.facts.calls
            if c.stmt is not None and _within(ctx, c.stmt, stmt, {id(stmt)})
        ]
    for call in calls:
        if call.qname in vocab.IMPORT_PATH_CHANGES:
            return True
        callee = ctx.facts.module_functions.get(call.qname.lstrip("."))
        if callee is not None and _changes_imports(ctx, callee, seen):
            return True
    return False


def _in_function(ctx: SourceFile, call: CallFact, func: cst.FunctionDef) -> bool:
    scope: object = call.func
    while scope is not None:
        if scope is func:
            return True
        scope = ctx.facts.func_parent.get(id(scope))
    return False
