"""Lint, run by the converter on what it reads and on what it writes.

On the input, lint's findings of the fixable rules are the report's by-rule count of what the
rewrites fix. On the output, each file is linted as part of the distributed program: an MN301
deadlock the input did not have is an internal error (the driver re-plans once, then refuses the
file); every other hazard still there needs a person. Lint judges each output file as part of
the converted program (mnify/program/project.py): a model converted where another file builds
it, the trainers distributed at run time and a helper fixed where it is called are answers the
hazards see themselves.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

from libcst.metadata import MetadataWrapper

from mnify.converter.steps import fixable_codes
from mnify.lint.diagnostic import Diagnostic, LintSyntaxError
from mnify.lint.registry import ALL_RULES, select_rules
from mnify.lint.runner import (
    diagnose,
    lint_source,
    lint_wrapper,
    parse_project,
    project_collectives,
)
from mnify.program.effects import ProjectEffects
from mnify.program.project import ProjectUses
from mnify.program.walk import FileProgram, walk_program
from mnify.rewrites import loops
from mnify.rewrites.context import FileContext
from mnify.rewrites.input_lines import input_line
from mnify.rewrites.options import ConvertOptions
from mnify.rewrites.report import ReportEntry
from mnify.rewrites.result import FileResult

# rules the converter's output must not newly break (MN301 deadlocks: error; MN302: report)
_DEADLOCK_RULES = ("MN301", "MN302")
_DEFAULT_CODES = frozenset(r.code for r in ALL_RULES if r.default_enabled)
_DISTRIBUTED = re.compile(r"create_communicator|comm\.rank|\bchainermn\b")


def _assumed(options: ConvertOptions) -> str:
    """How lint judges the files of a conversion: parts of a data- or model-parallel program."""
    return "data" if options.data_parallel else "model"


def walk_input(
    wrapper: MetadataWrapper,
    path: str,
    options: ConvertOptions,
    effects: ProjectEffects | None = None,
) -> FileProgram:
    """The input's program, built in its one walk with the fixable rules attached: what
    ``mnify lint`` finds in the input read as the distributed program it is to become
    (``effects``: the conversion's, which say what the file's calls build)."""
    wanted = [code for code in fixable_codes() if code in _DEFAULT_CODES]
    return walk_program(
        wrapper,
        path,
        hazards=select_rules(wanted, None, None),
        assume=_assumed(options),
        effects=effects,
    )


def lint_input(ctx: FileContext) -> None:
    """The fixable rules' findings in the input (ridden along the program's walk), for the
    report's by-rule count (the rewrites fix them). A lint failure costs a note, never the
    conversion."""
    failure = ctx.program.hazard_failure
    if failure is None:
        try:
            found = diagnose(ctx.program, ctx.suppressions, source=ctx.source)
        except Exception as exc:
            failure = exc
    if failure is not None:
        ctx.report.entries.append(
            ReportEntry(ctx.path, 1, "lint", "info", f"lint failed on this file: {failure}")
        )
        return
    ctx.report.found.extend(
        ReportEntry(ctx.path, d.line, "lint", "info", d.message, d.code) for d in found
    )


def _finding_keys(source: str, findings: list[Diagnostic]) -> Counter[tuple[str, str]]:
    lines = source.splitlines()
    return Counter(
        (d.code, lines[d.line - 1].strip() if 0 < d.line <= len(lines) else "") for d in findings
    )


def lint_output(
    results: Mapping[str, FileResult],
    options: ConvertOptions,
    effects: ProjectEffects | None = None,
) -> dict[str, Diagnostic]:
    """Lint the converted project, each file as part of the distributed program the project is
    (its collectives and its uses of each other's code, mnify/program/project.py; what its
    calls build, from the input's ``effects``: the output spells them as the input did): MN301
    findings its input did not have are returned (first per file: an internal error); every
    other hazard left in the output needs a person, except what a rewrite declared it leaves."""
    done = {p: r for p, r in results.items() if r.output is not None and r.skipped is None}
    if not any(r.changed for r in done.values()):
        return {}
    outputs = {p: r.output for p, r in done.items() if r.output is not None}
    inputs = {p: r.source for p, r in done.items()}
    wrappers = parse_project(outputs)
    external_out = project_collectives(outputs, wrappers)
    distributed_input = any(_DISTRIBUTED.search(text) for text in inputs.values())
    external_in = project_collectives(inputs) if distributed_input else {}
    uses = ProjectUses.of_sources(outputs.values())
    new: dict[str, Diagnostic] = {}
    for path, result in done.items():
        try:
            if path not in wrappers or _not_in_the_job(result):
                continue
            after = lint_wrapper(
                wrappers[path],
                path,
                source=outputs[path],
                select=sorted(_DEFAULT_CODES),
                external_collectives=external_out,
                assume=_assumed(options),
                project=uses,
                effects=effects,
            )
            before = (
                lint_source(
                    inputs[path],
                    path,
                    select=list(_DEADLOCK_RULES),
                    external_collectives=external_in,
                )
                if _DISTRIBUTED.search(inputs[path])
                else []
            )
        except LintSyntaxError:
            continue  # the output was compiled already; libcst may still refuse odd syntax
        had = _finding_keys(inputs[path], before)
        lines = outputs[path].splitlines()
        for finding in after:
            key = (finding.code, lines[finding.line - 1].strip() if finding.line else "")
            if finding.code in _DEADLOCK_RULES and had[key] > 0:
                had[key] -= 1
                continue
            if finding.code == "MN301":
                new.setdefault(path, finding)
                continue
            if finding.code == "MN501" and _built_everywhere_on_purpose(result, finding):
                continue
            result.entries.append(
                ReportEntry(
                    path,
                    input_line(result.source, result.output, finding.line),
                    "lint",
                    "needs-person",
                    finding.message,
                    finding.code,
                )
            )
    return new


def _not_in_the_job(result: FileResult) -> bool:
    """A script left as it is because it trains nothing (MN801): the distributed job does not
    run it, so what lint would find in it as part of the job (its evaluation loops, its
    datasets on every rank) needs nobody."""
    return not result.changed and any(e.code == "MN801" for e in result.entries)


def _built_everywhere_on_purpose(result: FileResult, finding: Diagnostic) -> bool:
    """MN501 on arrays a hand-written loop's rewrite scatters while every rank still builds
    them: the report already says so (an info entry), and why."""
    name = finding.message.split("`")[1] if finding.message.count("`") >= 2 else ""
    said = f"{loops.EVERY_RANK_BUILDS}{name} "
    return bool(name) and any(
        e.step == "hand-loop" and e.message.startswith(said) for e in result.entries
    )
