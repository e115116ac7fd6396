"""The imports the emitted code needs: ``from mnify import runtime as mn`` (or
``import chainermn``), plus ``multiprocessing``/``chainer`` when a rewrite used them.

They go after the file's leading imports; an import already present (under any spelling the
qualified-name walk recorded) is not added twice.
"""

from __future__ import annotations

import libcst as cst

from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import statement


def _present(ctx: FileContext, line: str) -> bool:
    bound = ctx.facts.imported_modules
    if line == "from mnify import runtime as mn":
        return bound.get("mn") == "mnify.runtime"
    if line.startswith("import "):
        module = line.split()[1]
        return bound.get(module) == module
    return False


def emit(ctx: FileContext) -> None:
    wanted = [line for line in sorted(ctx.imports_needed) if not _present(ctx, line)]
    # standard library first, then the runtime, as isort would group them
    wanted.sort(key=lambda line: (line.startswith(("from mnify", "import chainermn")), line))
    if not wanted:
        return
    new = [statement(line + "\n") for line in wanted]
    if ctx.facts.imports:
        ctx.plan.insert_after(ctx.facts.imports[-1], new, first=True)
        return
    body = list(ctx.module.body)
    if not body:
        return
    first = body[0]
    is_doc = (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
    if is_doc and len(body) > 1:
        ctx.plan.insert_after(first, new, first=True)
    else:
        ctx.plan.insert_before(first, new, first=True)
