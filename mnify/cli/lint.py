"""``mnify lint``, ``mnify explain`` and ``mnify rules`` (ruff-style flags, output and exit codes:
0 clean, 1 findings, 2 usage error, unparsable file or internal error)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mnify.config import ConfigError
from mnify.lint.docs import EXAMPLE_IMPORTS, render_markdown
from mnify.lint.files import LintResult, lint_paths
from mnify.lint.formatters import FORMATS, format_diagnostics, format_statistics
from mnify.lint.registry import ALL_RULES, SelectorError, rule_for, split_selectors

if TYPE_CHECKING:
    from mnify.rewrites.registry import Rewrite

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _selectors(values: tuple[str, ...], option: str) -> list[str]:
    try:
        return split_selectors(values)
    except SelectorError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--select", multiple=True, help="Rules to run: codes, prefixes or ALL (comma-separated)."
)
@click.option("--ignore", multiple=True, help="Rules to skip: codes or prefixes.")
@click.option("--extend-select", multiple=True, help="Rules to run in addition to the selection.")
@click.option(
    "--output-format",
    type=click.Choice(FORMATS),
    default="concise",
    show_default=True,
    help="How findings are printed.",
)
@click.option(
    "--statistics",
    is_flag=True,
    help="Print the number of findings per rule instead (JSON with --output-format json).",
)
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option(
    "--fix",
    is_flag=True,
    help="Apply the fixes `mnify convert` would make for the selected rules, in place.",
)
@click.option(
    "--stdin-filename",
    default=None,
    help="Name shown (and used to find the config) for source read from stdin (PATH '-').",
)
def lint(
    paths: tuple[Path, ...],
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    extend_select: tuple[str, ...],
    output_format: str,
    statistics: bool,
    exit_zero: bool,
    fix: bool,
    stdin_filename: str | None,
) -> None:
    """Report distributed-training hazards in PATHS (files, directories searched for *.py, or
    '-' for standard input)."""
    chosen = _selectors(select, "--select") if select else None
    ignored = _selectors(ignore, "--ignore")
    extended = _selectors(extend_select, "--extend-select")
    read_stdin = Path("-") in paths
    if fix and read_stdin:
        raise click.UsageError("--fix rewrites files in place; it cannot read standard input")
    targets = [p for p in paths if p != Path("-")] or ([] if read_stdin else [Path(".")])
    missing = [p for p in targets if not p.exists()]
    for path in missing:
        click.echo(f"error: cannot lint {path.as_posix()}: no such file or directory", err=True)

    def run() -> LintResult:
        return lint_paths(
            [p for p in targets if p.exists()],
            select=chosen,
            ignore=ignored,
            extend_select=extended,
            stdin=sys.stdin.buffer.read() if read_stdin else None,
            stdin_filename=stdin_filename or "-",
        )

    try:
        result = run()
        if fix and _fix_files(result):
            result = run()  # what is left after the fixes
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    for line in result.errors:
        click.echo(line, err=True)
    if statistics:
        click.echo(format_statistics(result.diagnostics, output_format), nl=False)
    else:
        unlinted = len(result.errors) + len(missing)
        click.echo(format_diagnostics(result.diagnostics, output_format, unlinted), nl=False)
        if output_format == "concise" and not (result.diagnostics or unlinted):
            for script in result.single_process:
                # the rules judge a script as the distributed program it is part of; one with
                # no communicator is not one yet, which "All checks passed!" alone would hide
                click.echo(
                    f"note: {script} creates no communicator: it runs as a single process; "
                    f"`mnify convert {script}` makes it distributed",
                    err=True,
                )
    if result.errors or missing:
        sys.exit(EXIT_ERROR)
    if result.diagnostics and not exit_zero:
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_CLEAN)


def _fix_files(result: LintResult) -> int:
    """Rewrite each file with fixable findings (the converter's fixes for those rules), safely
    and in its own encoding; returns how many findings were fixed. A file whose fix fails its
    checks is left as it was, with an ``error:`` line."""
    from mnify.converter.fix import fix_source
    from mnify.sourcefile import SourceDecodeError, read_source, write_file

    by_file: dict[str, list[str]] = {}
    for d in result.diagnostics:
        if d.fixable:
            by_file.setdefault(d.path, []).append(d.code)
    fixed = 0
    for shown, codes in sorted(by_file.items()):
        path = Path(shown)
        try:
            source = read_source(path)
        except (OSError, SourceDecodeError) as exc:
            click.echo(f"error: cannot fix {shown}: {exc}", err=True)
            continue
        outcome = fix_source(source.text, shown, codes)
        if outcome.error is not None or outcome.output is None:
            click.echo(f"error: cannot fix {shown}: {outcome.error}", err=True)
            continue
        if outcome.output == source.text:
            continue
        try:
            write_file(path, source.encode(outcome.output))
        except (OSError, ValueError) as exc:
            click.echo(f"error: cannot fix {shown}: {exc}", err=True)
            continue
        fixed += len(codes)
        click.echo(f"fixed {shown}: {', '.join(sorted(set(codes)))}", err=True)
    return fixed


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())


@click.command()
@click.argument("code")
def explain(code: str) -> None:
    """Explain rule CODE (or rule name): what, when it fires, why, bad and good example."""
    rule = rule_for(code)
    if rule is None:
        from mnify.converter import docs as step_docs

        step = step_for_code(code)
        if step is not None:
            click.echo(step_docs.render_step(step, heading="#"), nl=False)
            return
        click.echo(
            f"error: unknown rule '{code}'; `mnify rules` lists them "
            "(`mnify rules --converter` the converter's MN8xx steps)",
            err=True,
        )
        sys.exit(EXIT_ERROR)
    click.echo(
        f"{rule.code} ({rule.name})\n\n"
        f"What: {rule.summary}.\n\n"
        f"Fires when:\n{_indent(rule.condition().replace('``', '`'))}\n"
        f"Why:\n{_indent(textwrap.fill(rule.why, width=92))}\n"
        f"Bad:\n{_indent(rule.bad)}\n"
        f"Good:\n{_indent(rule.good)}\n"
        f"Fixed by `mnify convert` and `mnify lint --fix`: {'yes' if rule.fixable else 'no'}. "
        f"On by default: {'yes' if rule.default_enabled else 'no'}. "
        f"Checks {rule.applies_to.value}.\n\n"
        f"The examples assume:\n{_indent(EXAMPLE_IMPORTS)}",
        nl=False,
    )


@click.command()
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "markdown", "json"]),
    default="table",
    show_default=True,
)
@click.option(
    "--converter",
    is_flag=True,
    help="List the converter's steps (MN8xx codes) instead of the lint rules.",
)
def rules(output_format: str, converter: bool) -> None:
    """List every rule: code, name, whether `mnify convert` fixes it, whether it is on by default."""
    if converter:
        _converter_steps(output_format)
        return
    if output_format == "markdown":
        click.echo(render_markdown(ALL_RULES), nl=False)
        return
    if output_format == "json":
        rows = [
            {
                "code": rule.code,
                "name": rule.name,
                "summary": rule.summary,
                "fixable": rule.fixable,
                "default": rule.default_enabled,
            }
            for rule in ALL_RULES
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="mnify lint rules")
    for column in ("code", "name", "fixable", "default", "summary"):
        table.add_column(column)
    for rule in ALL_RULES:
        table.add_row(
            rule.code,
            rule.name,
            "yes" if rule.fixable else "no",
            "on" if rule.default_enabled else "off",
            rule.summary,
        )
    Console(file=sys.stdout, width=160).print(table)


def step_for_code(code: str) -> Rewrite | None:
    """The converter step named by an MN8xx code or a step name (``mnify explain MN803``)."""
    from mnify.converter import docs as step_docs

    return step_docs.step_for(code)


def _converter_steps(output_format: str) -> None:
    """``mnify rules --converter``: the MN8xx steps (docs/converter.md is the markdown form)."""
    from mnify.converter import docs as step_docs
    from mnify.converter.steps import load_rewrites

    steps = load_rewrites()
    if output_format == "markdown":
        click.echo(step_docs.render_markdown(steps), nl=False)
        return
    if output_format == "json":
        rows = [
            {"code": s.own_code, "step": s.step, "order": s.order, "fixes": list(s.fixes)}
            for s in steps
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="mnify convert steps")
    for column in ("code", "step", "order", "fixes", "summary"):
        table.add_column(column)
    for s in steps:
        first = step_docs.step_doc(s).split("\n\n", 1)[0].replace("\n", " ")
        table.add_row(s.own_code, s.step, str(s.order), ", ".join(s.fixes) or "-", first)
    Console(file=sys.stdout, width=160).print(table)
