"""Converting files, as a pipeline: parse -> analyse -> detect -> plan -> apply -> verify -> write.

Each stage is one function below. Several files convert together as one project: a model class
in ``net.py`` that holds BatchNormalization is converted where ``train.py`` builds it
(``call_sites``), project facts are shared before planning (``project_facts``), the project-wide
policies run once every file is planned (``project_policies``), and the deadlock check follows
calls from file to file (``reconcile``). Every output is checked against its input and plan
(``verify``) and must parse before it is handed out ("write"; the CLI writes it); a file that
fails gets an error and is left untouched.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper

from mnify.converter import reconcile
from mnify.converter.steps import load_rewrites
from mnify.lint.runner import project_collectives
from mnify.program.effects import ProjectEffects
from mnify.program.noqa import parse_suppressions
from mnify.rewrites import (
    call_sites,
    communicator,
    distributed,
    imports,
    loops,
    verify,
)
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import ApplyEdits
from mnify.rewrites.options import ConvertOptions
from mnify.rewrites.project_facts import share_project_facts
from mnify.rewrites.project_policies import apply_project_policies
from mnify.rewrites.records import plan_records
from mnify.rewrites.report import ReportEntry
from mnify.rewrites.result import FileResult
from mnify.rewrites.verify import VerificationError

__all__ = ["FileResult", "convert_source", "convert_sources", "module_name", "parse_error"]


def convert_sources(
    sources: Mapping[str, str],
    options: ConvertOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[FileResult]:
    """Convert ``{path: source}`` together; results in the same order.

    ``progress(path)`` is called as each file is finished (for a progress bar). The outputs
    pass the deadlock rule MN301 as a project (calls into other converted files count): when the
    first conversion puts a call that now reaches a collective under a rank guard, the project
    is planned again with those calls kept on every rank; a finding that still remains is an
    internal error for its file, which then gets no output.
    """
    options = options or ConvertOptions()
    trees = _syntax_trees(sources)
    effects = ProjectEffects(trees)
    results = _convert_project(sources, options, progress, frozenset(), trees, effects)
    new = reconcile.lint_output(results, options, effects)
    if new:
        outputs = {p: r.output for p, r in results.items() if r.output is not None}
        callees = frozenset(project_collectives(outputs))
        results = _convert_project(sources, options, None, callees, trees, effects)
        new = reconcile.lint_output(results, options, effects)
    for path, finding in new.items():
        result = results[path]
        result.error = f"internal: {finding.line}: {finding.message} (MN301, not in the input)"
        result.output = None
    return [results[p] for p in sources]


def convert_source(
    source: str, path: str = "<string>", options: ConvertOptions | None = None
) -> FileResult:
    """Convert one file on its own."""
    return convert_sources({path: source}, options)[0]


def _syntax_trees(sources: Mapping[str, str]) -> dict[str, ast.Module]:
    """Each file's ``ast`` tree, parsed once: the program's effects are read from it and the
    output is checked against it (``verify``); a file that does not parse has none."""
    trees: dict[str, ast.Module] = {}
    for path, source in sources.items():
        try:
            trees[path] = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
    return trees


def _convert_project(
    sources: Mapping[str, str],
    options: ConvertOptions,
    progress: Callable[[str], None] | None,
    collective_callees: frozenset[str],
    trees: Mapping[str, ast.Module],
    effects: ProjectEffects,
) -> dict[str, FileResult]:
    """One pass of the pipeline over the project (see :func:`convert_sources`)."""
    results = {path: FileResult(path, source) for path, source in sources.items()}
    contexts: dict[str, FileContext] = {}
    for path, result in results.items():
        module = _parse(result)
        if module is not None:
            ctx = _analyse(result, module, options, collective_callees, effects)
            if ctx is not None:
                contexts[path] = ctx
    for ctx in contexts.values():
        ctx.effects = effects
    share_project_facts(contexts, sources)
    for path, ctx in list(contexts.items()):
        try:
            _detect(ctx)
            _plan(ctx)
        except Exception as exc:  # a rewrite bug costs this file, not the whole run
            results[path].error = f"internal: 1: error while planning: {exc!r}"
            del contexts[path]
    _plan_project(contexts)
    for path in sources:
        if path not in contexts and progress is not None:
            progress(path)
    for path, ctx in contexts.items():
        if progress is not None:
            progress(path)
        result = results[path]
        try:
            _apply_verify_write(ctx, result, trees.get(path))
        except Exception as exc:
            result.error = f"internal: 1: error while converting: {exc!r}"
    return results


def _parse(result: FileResult) -> cst.Module | None:
    """The file's libcst module; None (and why, on ``result``) for a file marked
    ``# mnify: noqa`` or one that does not parse."""
    if parse_suppressions(result.source).whole_file:
        result.skipped = "# mnify: noqa"
        return None
    try:
        return cst.parse_module(result.source)
    except Exception as exc:  # libcst raises ParserSyntaxError, but be safe on odd input
        result.error = parse_error(exc, result.source, result.path)
        return None


def parse_error(exc: Exception, source: str, path: str) -> str:
    """``LINE:COL: reason`` for a file that does not parse: where CPython's ``compile()`` says
    (what the user sees when running it), else libcst's position (1-based column)."""
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as syntax:
        return f"{syntax.lineno or 1}:{syntax.offset or 1}: {syntax.msg}"
    except ValueError as bad:  # null bytes
        return f"1:1: {bad}"
    if isinstance(exc, cst.ParserSyntaxError):
        reason = exc.message.strip().splitlines()[0] if exc.message else "invalid syntax"
        return f"{exc.raw_line}:{exc.raw_column + 1}: {reason}"
    return f"1:1: {exc}"


def module_name(path: str) -> str:
    return Path(path).stem


def _analyse(
    result: FileResult,
    module: cst.Module,
    options: ConvertOptions,
    collective_callees: frozenset[str],
    effects: ProjectEffects,
) -> FileContext | None:
    """Resolve names once and build the file's program in one walk (its facts, and the fixable
    hazards' findings that ``_detect`` reads); None (the file is handed back as it is)
    for a file that is distributed already, unless the options say to convert it anyway."""
    path, source = result.path, result.source
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    program = reconcile.walk_input(wrapper, path, options, effects)
    ctx = FileContext(path, module_name(path), source, program, options)
    ctx.collective_callees = collective_callees
    why = distributed.reason(ctx) if options.leave_distributed else None
    if why is None:
        return ctx
    result.skipped = f"already distributed ({why})"
    result.output = source
    result.entries.append(ReportEntry(path, 1, "distributed", "info", f"left unchanged: {why}"))
    return None


def _detect(ctx: FileContext) -> None:
    """What the input's hazards found in the program's walk, for the report's by-rule count
    (``reconcile``)."""
    reconcile.lint_input(ctx)


def _plan(ctx: FileContext) -> None:
    """Every registered rewrite plans its edits, in the registry's order (the dataset's
    loading guards before the print guards; the forkserver after everything that needs comm)."""
    only = ctx.options.only_codes
    for step in load_rewrites():
        if only is not None and step.step != "communicator" and not (step.codes & only):
            continue
        step.plan(ctx)
        if step.step == "communicator" and ctx.entry is not None:
            ctx.plan.comm = ctx.entry.comm


def _plan_project(contexts: Mapping[str, FileContext]) -> None:
    """Work planned across files: ``comm`` threaded through helpers and model classes and the
    work they cannot do done where they are called, hand-written loops split where another
    file's training function is called, then the project-wide policies."""
    call_sites.plan_project(contexts)
    loops.plan_project(contexts)
    apply_project_policies(contexts)


def _apply_verify_write(
    ctx: FileContext, result: FileResult, tree: ast.Module | None = None
) -> None:
    """Apply the plan, check the output, and hand it out only if the check passes."""
    new = _apply(ctx)
    result.entries = ctx.report.entries
    result.found = ctx.report.found
    if new is None:
        result.output = ctx.source
        return
    error = _verify(ctx, new, tree)
    if error is not None:
        result.error = error
        return
    result.output = new  # write


def _apply(ctx: FileContext) -> str | None:
    """Insert the communicator and imports and apply the plan in one pass; None when nothing
    is planned (the file stays as it is)."""
    communicator.emit(ctx, ctx.preamble)
    communicator.emit_helper_fetches(ctx)
    imports.emit(ctx)
    if not ctx.plan:
        return None
    return ctx.module.visit(ApplyEdits(ctx.plan, ctx.facts.parent_statement)).code


def _verify(ctx: FileContext, new: str, tree: ast.Module | None = None) -> str | None:
    """Why the output may not be handed out, or None: it must parse, differ from the input only
    as the plan says, and bear out the report's claims (``verify``)."""
    try:
        # Python's own parser re-reads the output: what it rejects is never handed out.
        compile(new, ctx.path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        try:
            compile(ctx.source, ctx.path, "exec", dont_inherit=True)
        except SyntaxError as original:  # the input was never valid Python 3 to begin with
            return f"{original.lineno or 1}:{original.offset or 1}: {original.msg}"
        return f"internal: {exc.lineno or 1}:{exc.offset or 1}: output does not parse: {exc.msg}"
    try:
        records = plan_records(ctx)
        verify.check_output(ctx.source, new, records, tree)
        verify.check_claims(new, records)
    except VerificationError as bad:
        return f"internal: {bad.line}: {bad.message}"
    return None
