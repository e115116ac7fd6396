"""Linting one file: parse once, resolve ``QualifiedNameProvider`` once, build the file's program
in its one walk with every selected rule attached (TorchFix/Fixit style batching,
``mnify.program.walk``), then turn the findings into sorted ``Diagnostic``s. Positions are
resolved only when there is something to report."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from mnify.hazards.rule import Finding, Rule
from mnify.lint.diagnostic import Diagnostic, LintSyntaxError
from mnify.lint.registry import select_rules
from mnify.program.effects import ProjectEffects
from mnify.program.noqa import Suppressions, parse_suppressions
from mnify.program.project import ProjectUses
from mnify.program.walk import FileProgram, walk_program


def parse(source: str, path: str) -> cst.Module:
    """Parse or raise ``LintSyntaxError`` with the 1-based line and column of the failure."""
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        # CPython's own parser gives the better position and message; libcst's is the fallback
        # for code CPython accepts but libcst does not.
        try:
            ast.parse(source, filename=path)
        except SyntaxError as syntax:
            raise LintSyntaxError(path, syntax.lineno or 1, syntax.offset or 1, syntax.msg) from exc
        except ValueError:  # null bytes
            pass
        raise LintSyntaxError(path, exc.editor_line, exc.editor_column, exc.message) from exc


def lint_source(
    source: str,
    path: str,
    *,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    extend_select: Sequence[str] | None = None,
    external_collectives: Mapping[str, str] | None = None,
    assume: str | None = None,
    project: ProjectUses | None = None,
    seen: Callable[[FileProgram], None] | None = None,
    effects: ProjectEffects | None = None,
) -> list[Diagnostic]:
    """Lint one file's text (``seen``: handed the file's program, see :func:`lint_wrapper`). Raises ``LintSyntaxError`` when it does not parse and
    ``SelectorError`` for an unknown selector."""
    # the module was parsed here and nobody else holds it: no need for the defensive deep copy
    wrapper = MetadataWrapper(parse(source, path), unsafe_skip_copy=True)
    return lint_wrapper(
        wrapper,
        path,
        select=select,
        ignore=ignore,
        extend_select=extend_select,
        source=source,
        external_collectives=external_collectives,
        assume=assume,
        project=project,
        seen=seen,
        effects=effects,
    )


def lint_wrapper(
    wrapper: MetadataWrapper,
    path: str,
    *,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    extend_select: Sequence[str] | None = None,
    source: str | None = None,
    external_collectives: Mapping[str, str] | None = None,
    assume: str | None = None,
    project: ProjectUses | None = None,
    seen: Callable[[FileProgram], None] | None = None,
    effects: ProjectEffects | None = None,
) -> list[Diagnostic]:
    """Lint an already built ``MetadataWrapper`` (the converter shares its resolution: metadata
    already resolved on ``wrapper`` is reused, not recomputed). ``external_collectives`` names
    the functions of other files of the project that perform collectives (see
    :func:`project_collectives`), so calling one under a rank check is found too. ``assume``
    ("data" or "model") judges the file as part of a data- or model-parallel program even if it
    creates no communicator (how ``mnify convert`` reads its input and its output).
    ``project`` says how the program's files use each other's code; by default the file is a
    program of its own. ``seen`` is handed the file's program once walked (what kind of script
    it is: ``mnify lint`` says which training scripts run as one process). ``effects``: the
    program's effects (mnify/program/effects.py), which say what a call builds whatever its
    name (a project's subclass of a Chainer optimizer is an optimizer; its own class named
    ``SGD`` is not); without them names decide."""
    rules = select_rules(select, ignore, extend_select)
    text = source if source is not None else wrapper.module.code
    suppressions = parse_suppressions(text)
    if suppressions.whole_file or not rules:
        return []
    program = walk_program(
        wrapper,
        path,
        hazards=rules,
        assume=assume,
        external_collectives=external_collectives,
        facts=False,
        effects=effects,
    )
    if program.hazard_failure is not None:
        raise program.hazard_failure
    if seen is not None:
        seen(program)
    return diagnose(program, suppressions, project=project, source=text)


def diagnose(
    program: FileProgram,
    suppressions: Suppressions,
    *,
    project: ProjectUses | None = None,
    source: str | None = None,
) -> list[Diagnostic]:
    """The sorted diagnostics of the hazards that rode ``program``'s walk: each hazard that
    applies to the file finishes, then its findings not answered elsewhere in the program
    (``project``; by default the file is a program of its own) nor suppressed are placed."""
    ctx = program.context
    findings: list[tuple[Rule, Finding]] = []
    for rule in program.hazards:
        if rule.applies():
            rule.finish()
            findings.extend((rule, finding) for finding in rule.findings)
    if not findings:
        return []
    # read only now: most files have no finding to answer, and reading the program costs a parse
    text = source if source is not None else program.module.code
    ctx.project = project if project is not None else ProjectUses.of_sources([text])
    positions = program.wrapper.resolve(PositionProvider)
    spans = [(positions[f].start.line, positions[f].end.line, f.name.value) for f in ctx.functions]
    diagnostics = set()
    for rule, finding in findings:
        where = positions[finding.node]
        if rule.answered_elsewhere(finding, _innermost(spans, where.start.line)):
            continue
        message = finding.message
        if finding.related is not None:
            message = message.replace("{line}", str(positions[finding.related].start.line))
        if suppressions.suppresses(where.start.line, rule.code):
            continue
        diagnostics.add(
            Diagnostic(
                path=program.path,
                line=where.start.line,
                col=where.start.column + 1,
                code=rule.code,
                message=message,
                end_line=where.end.line,
                end_col=where.end.column + 1,
                fixable=rule.fixable,
            )
        )
    return sorted(diagnostics)


def _innermost(spans: Sequence[tuple[int, int, str]], line: int) -> str | None:
    """The name of the innermost function (of ``(first, last, name)`` spans) around ``line``."""
    best: tuple[int, int, str] | None = None
    for span in spans:
        if span[0] <= line <= span[1] and (best is None or span[0] >= best[0]):
            best = span
    return best[2] if best is not None else None


def parse_project(files: Mapping[str, str]) -> dict[str, MetadataWrapper]:
    """Every file that parses, wrapped for metadata (resolve once, lint and analyse many times)."""
    modules: dict[str, MetadataWrapper] = {}
    for path, source in files.items():
        try:
            modules[path] = MetadataWrapper(parse(source, path), unsafe_skip_copy=True)
        except LintSyntaxError:
            continue
    return modules


def project_collectives(
    files: Mapping[str, str], wrappers: Mapping[str, MetadataWrapper] | None = None
) -> dict[str, str]:
    """Module-level functions of a project's files that perform a collective, directly or
    through other functions of the project: ``{"helpers.load_data": "scatter_dataset"}``
    (module named by its file's stem). Files that do not parse are left out; ``wrappers``
    (from :func:`parse_project`) saves parsing them again."""
    from mnify.hazards.mn301_collective_on_some_ranks import CollectiveOnSomeRanks

    modules = dict(wrappers) if wrappers is not None else parse_project(files)
    if len(modules) < 2:
        return {}  # a file's own functions are followed by MN301 itself
    found: dict[str, str] = {}
    for _ in range(len(modules) + 1):  # each round can add a caller of last round's finds
        grown: dict[str, str] = {}
        for path, wrapper in modules.items():
            program = walk_program(
                wrapper,
                path,
                hazards=[CollectiveOnSomeRanks],
                external_collectives=found,
                facts=False,
            )
            (rule,) = program.hazards
            stem = path.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
            for name, what in rule.module_functions_with_collectives().items():
                grown[f"{stem}.{name}"] = what
        if grown == found:
            break
        found = grown
    return found
