"""``mnify convert``: show (or write) the multi-node version of single-GPU Chainer scripts.

By default it prints a unified diff and writes nothing (exit 0); ``--check`` exits 1 when a file
would change; ``-o``, ``--outtree`` and ``--in-place`` write. Files given together (or a
directory) convert as one project. Files are read and written through ``mnify.sourcefile`` (their
own encoding, BOM and line endings; atomic writes; exclusive backups). A file that cannot be
decoded or parsed gets ``error: cannot convert PATH: LINE:COL: reason``, one that cannot be read
or written ``error: PATH: reason``; the others continue, the summary line is printed, exit 2.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

from mnify.converter.driver import FileResult, convert_sources
from mnify.rewrites.options import ConvertOptions
from mnify.rewrites.report import FileOutcome, Report
from mnify.sourcefile import (
    SourceDecodeError,
    SourceEncodeError,
    SourceText,
    WriteRefused,
    describe_os_error,
    read_source,
    rewrite_in_place,
    write_file,
)
from mnify.sourcetree import copy_tree, python_files

_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".ruff_cache", "node_modules"}


@dataclass
class _Failures:
    """Per-file failures (the reason, for the report) and the error lines to print."""

    reasons: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def add(self, path: str, reason: str, *, positional: bool = False) -> None:
        """``positional`` reasons (``LINE:COL: ...``) read as ``cannot convert PATH: ...``;
        the converter's own failures (``internal: LINE: ...``) as ``internal: PATH:LINE: ...``."""
        self.reasons.setdefault(path, reason)
        if reason.startswith("internal: "):
            self.lines.append(f"error: internal: {path}:{reason.removeprefix('internal: ')}")
            return
        prefix = "cannot convert " if positional else ""
        self.lines.append(f"error: {prefix}{path}: {reason}")

    def note(self, path: Path, reason: str) -> None:
        """A failure that is not one converted file's (a directory, the report, the tree)."""
        self.lines.append(f"error: {path}: {reason}")

    def unwritten(self, paths: list[str], where: Path, reason: str) -> None:
        """Writing ``where`` failed, so ``paths``' conversions were not written."""
        self.note(where, reason)
        for path in paths:
            self.reasons.setdefault(path, f"not written: {where}: {reason}")


def _gather(src: tuple[Path, ...], failures: _Failures) -> list[Path]:
    """The files to convert, each once even when reached by two names (a link, a hard link)."""
    files: list[Path] = []
    for s in src:
        if s.is_dir():
            found, problems = python_files(s, _SKIP_DIRS)
            files.extend(found)
            for problem in problems:
                failures.note(problem.path, problem.reason)
        else:
            files.append(s)
    seen: set[object] = set()
    unique: list[Path] = []
    for f in files:
        key: object
        try:
            info = f.stat()
            key = (info.st_dev, info.st_ino)
        except OSError:
            key = os.path.realpath(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _read_all(files: list[Path], failures: _Failures) -> dict[str, SourceText]:
    sources: dict[str, SourceText] = {}
    for f in files:
        try:
            sources[str(f)] = read_source(f)
        except OSError as exc:
            failures.add(str(f), describe_os_error(f, exc))
        except SourceDecodeError as exc:
            failures.add(str(f), str(exc), positional=True)
    return sources


def _show_diff(diff: str, color: bool) -> None:
    if not color:
        click.echo(diff, nl=False)
        return
    from rich.console import Console
    from rich.syntax import Syntax

    # --color on a pipe means it: force_terminal keeps the colour codes.
    Console(highlight=False, force_terminal=True).print(
        Syntax(diff, "diff", theme="ansi_dark", background_color="default")
    )


def _convert_with_progress(
    sources: dict[str, str], options: ConvertOptions, show: bool
) -> list[FileResult]:
    if not show:
        return convert_sources(sources, options)
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("converting", total=len(sources))
        return convert_sources(sources, options, progress=lambda _: bar.advance(task))


@click.command("convert")
@click.argument("src", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="Write the one converted file here."
)
@click.option(
    "--outtree", type=click.Path(path_type=Path), help="Convert a directory into this new one."
)
@click.option("--in-place", is_flag=True, help="Rewrite the files (SRC.orig keeps the original).")
@click.option("--no-backup", is_flag=True, help="With --in-place: keep no SRC.orig.")
@click.option("--check", is_flag=True, help="Exit 1 when a file would change; write nothing.")
@click.option(
    "--target",
    type=click.Choice(["mnify", "chainermn"]),
    default="mnify",
    show_default=True,
    help="Emit mnify.runtime calls, or the same calls on real ChainerMN.",
)
@click.option(
    "--communicator",
    type=click.Choice(["auto", "naive", "flat", "hierarchical", "pure_nccl"]),
    default="auto",
    show_default=True,
    help="auto: flat on CPU runs (naive with --target chainermn), pure_nccl on GPU runs, decided from the script's device flag.",
)
@click.option(
    "--scaling",
    type=click.Choice(["weak", "strong"]),
    default="weak",
    show_default=True,
    help="weak: per-rank batch as written; strong: the global batch is kept (divided by ranks).",
)
@click.option(
    "--scale-lr",
    type=click.Choice(["none", "linear"]),
    default="none",
    show_default=True,
    help="linear: with weak scaling, the learning rate times the number of ranks, reached by a "
    "linear warm-up (Goyal et al.); never applied unless asked.",
)
@click.option(
    "--warmup-epochs",
    type=click.IntRange(min=0),
    default=None,
    help="With --scale-lr linear: epochs over which the learning rate reaches its scaled value "
    "[default: 5].",
)
@click.option(
    "--data",
    type=click.Choice(["scatter", "global"]),
    default=None,
    help="scatter: each rank trains on its shard (scatter_dataset) [default]; global: every rank "
    "holds the whole training set and reads its part of one global batch "
    "(mn.create_global_batch_iterator, mn.extensions.global_snapshot): the same training at any "
    "number of ranks, resumable at any number, for a copy of the data per rank.",
)
@click.option(
    "--grow-batch",
    is_flag=True,
    help="Replace learning-rate decay (ExponentialShift, StepShift, MultistepShift, a plain "
    "'lr *= r' extension) with mn.extensions.GrowBatch: the global batch grows instead. "
    "Implies --data global and --scaling strong.",
)
@click.option(
    "--model-parallel",
    type=click.Choice(["none", "channel", "spatial"]),
    default="none",
    show_default=True,
    help="channel: split convolutions' channels over ranks instead of the data; spatial: split "
    "every image into slabs of rows over ranks (halo exchange).",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path),
    help="Write the report (.json for JSON).",
)
@click.option("--color/--no-color", default=None, help="Colour the diff (default: on a terminal).")
def convert(
    src: tuple[Path, ...],
    output: Path | None,
    outtree: Path | None,
    in_place: bool,
    no_backup: bool,
    check: bool,
    target: str,
    communicator: str,
    scaling: str,
    scale_lr: str,
    warmup_epochs: int | None,
    data: str | None,
    grow_batch: bool,
    model_parallel: str,
    report_path: Path | None,
    color: bool | None,
) -> None:
    """Rewrite single-GPU Chainer scripts to run on N ranks (prints a diff by default)."""
    modes = [
        m for m, on in (("-o", output), ("--outtree", outtree), ("--in-place", in_place)) if on
    ]
    if len(modes) > 1:
        raise click.UsageError(f"{' and '.join(modes)} cannot be combined")
    if check and modes:
        raise click.UsageError(f"--check writes nothing; drop {modes[0]}")
    if warmup_epochs is not None and scale_lr != "linear":
        raise click.UsageError("--warmup-epochs only applies with --scale-lr linear")
    data, scaling = _data_options(data, grow_batch, scaling, target, model_parallel)
    if output is not None:
        _check_output(src, output)
    if outtree is not None:
        _check_outtree(src, outtree)
    options = ConvertOptions(
        target=target,  # type: ignore[arg-type]
        communicator=communicator,  # type: ignore[arg-type]
        scaling=scaling,  # type: ignore[arg-type]
        scale_lr=scale_lr,  # type: ignore[arg-type]
        warmup_epochs=5 if warmup_epochs is None else warmup_epochs,
        model_parallel=model_parallel,  # type: ignore[arg-type]
        data=data,  # type: ignore[arg-type]
        grow_batch=grow_batch,
    )
    failures = _Failures()
    gathered = _gather(src, failures)
    if not gathered and not failures.lines:
        # nothing to convert is a mistake in the command, not a clean conversion
        where = ", ".join(str(s) for s in src)
        click.echo(f"error: no Python file in {where}: nothing to convert", err=True)
        sys.exit(2)
    texts = _read_all(gathered, failures)
    tty = sys.stderr.isatty()
    sources = {path: text.text for path, text in texts.items()}
    results = _convert_with_progress(sources, options, show=tty and len(sources) > 1)
    use_color = sys.stdout.isatty() if color is None else color
    outputs: dict[str, bytes] = {}
    for r in results:
        if r.error is not None:
            failures.add(r.path, r.error, positional=True)
            continue
        if r.output is None:
            continue
        try:
            outputs[r.path] = texts[r.path].encode(r.output) if r.changed else texts[r.path].data
        except SourceEncodeError as exc:
            failures.add(r.path, str(exc), positional=True)
            continue
        if check and r.changed:
            click.echo(f"would convert {r.path}", err=True)
        elif not modes and not check and r.changed:
            _show_diff(r.diff(), use_color)
    if output is not None:
        _write_output(results, outputs, output, failures)
    elif outtree is not None:
        _write_outtree(results, outputs, src[0], outtree, failures)
    elif in_place:
        _write_in_place(results, texts, outputs, not no_backup, failures)
    report = _report(texts, results, failures)
    for line in failures.lines:
        click.echo(line, err=True)
    for entry in report.sorted_entries():
        if entry.severity == "needs-person":
            click.echo(f"needs a person: {entry.render()}", err=True)
    click.echo(report.summary(), err=True)
    if not check and not failures.lines:
        for line in next_steps(report, scaling, _verify_target(src, output, outtree, in_place)):
            click.echo(line, err=True)
    report_failed = report_path is not None and not _write_report(report, report_path)
    if failures.lines or report_failed:
        sys.exit(2)
    if check and any(r.changed for r in results):
        sys.exit(1)


def _data_options(
    data: str | None, grow_batch: bool, scaling: str, target: str, model_parallel: str
) -> tuple[str, str]:
    """``--data`` and ``--scaling`` as the conversion uses them: ``--grow-batch`` implies
    ``--data global`` and ``--scaling strong`` (the script's batch is the global batch it
    grows) and refuses an explicit contradiction; the global iterator is mnify's only."""
    if grow_batch:
        if data == "scatter":
            raise click.UsageError("--grow-batch grows the global batch: it needs --data global")
        if scaling == "weak" and _given("--scaling"):
            raise click.UsageError(
                "--grow-batch keeps the script's batch as the global batch: it needs "
                "--scaling strong"
            )
        data, scaling = "global", "strong"
    data = data or "scatter"
    if data == "global" and target != "mnify":
        raise click.UsageError(
            "--data global needs --target mnify (ChainerMN has no global-batch iterator)"
        )
    if data == "global" and model_parallel != "none":
        raise click.UsageError("--data global is data parallel: drop --model-parallel")
    return data, scaling


def _given(option: str) -> bool:
    """Whether the user typed ``option`` (click reports defaults and explicit values alike)."""
    context = click.get_current_context()
    source = context.get_parameter_source(option.lstrip("-").replace("-", "_"))
    return source is not None and source.name == "COMMANDLINE"


def next_steps(report: Report, scaling: str, script: str | None) -> list[str]:
    """At most three lines after the summary: the batch and what scaling does to the schedules,
    the number of items needing a person, and the command that proves the run data-parallel."""
    batches = [e for e in report.entries if e.fact("per_rank_batch") is not None]
    lines = []
    if batches:
        first = batches[0]
        per_rank, global_batch = first.fact("per_rank_batch"), first.fact("global_batch")
        if scaling == "weak":
            schedules = sum(1 for e in report.entries if e.fact("iteration_schedule"))
            counted = (
                f"; {schedules} schedule(s) counted in iterations now cover N times the "
                "examples (see the report)"
                if schedules
                else "; nothing here counts iterations"
            )
            lines.append(
                f"batch: {per_rank} per rank, {global_batch} global (weak scaling): on N ranks "
                f"an epoch takes 1/N of the iterations{counted}"
            )
        else:
            lines.append(
                f"batch: {global_batch} global as written, {per_rank} per rank (--scaling "
                "strong): epochs and iteration-counted schedules keep their meaning"
            )
    if lines and any(e.step == "global-data" and e.severity == "changed" for e in report.entries):
        lines[0] += " (--data global: any number of ranks trains like one process with it)"
    people = len(report.needs_person())
    lines.append(
        f"{people} item(s) need a person (listed above)" if people else "nothing needs a person"
    )
    if script is not None:
        lines.append(f"next: mnify run -n 2 --verify {shlex.quote(script)} [ARGS...]")
    return lines[:3]


def _verify_target(
    src: tuple[Path, ...], output: Path | None, outtree: Path | None, in_place: bool
) -> str | None:
    """The converted script to run: -o's file, the file in --outtree, the file itself
    (--in-place); the source when only a diff was shown (run it once it is written)."""
    if output is not None:
        return str(output)
    if len(src) != 1 or not src[0].is_file():
        return str(outtree) if outtree is not None else None
    if outtree is not None:
        return str(outtree / src[0].name)
    return str(src[0])


def _check_output(src: tuple[Path, ...], output: Path) -> None:
    """``-o`` names one new file: never the input itself, under any name."""
    if len(src) != 1 or src[0].is_dir():
        raise click.UsageError("-o takes exactly one source file; use --outtree for directories")
    same = os.path.realpath(output) == os.path.realpath(src[0])
    if not same and os.path.exists(output):
        same = os.path.samefile(output, src[0])  # also a hard link to the input
    if same:
        raise click.UsageError(
            f"-o {output} is the input file; use --in-place to rewrite it (with a backup)"
        )


def _check_outtree(src: tuple[Path, ...], outtree: Path) -> None:
    """``--outtree`` names a new directory outside the source tree that does not contain it."""
    if len(src) != 1 or not src[0].is_dir():
        raise click.UsageError("--outtree takes exactly one source directory")
    source, target = Path(os.path.realpath(src[0])), Path(os.path.realpath(outtree))
    if target == source or target.is_relative_to(source):
        raise click.UsageError(f"--outtree {outtree} is inside the source directory {src[0]}")
    if source.is_relative_to(target):
        raise click.UsageError(f"--outtree {outtree} contains the source directory {src[0]}")
    if os.path.lexists(outtree):
        raise click.UsageError(f"--outtree {outtree} exists; refusing to overwrite it")


def _write_output(
    results: list[FileResult], outputs: dict[str, bytes], output: Path, failures: _Failures
) -> None:
    for r in results:
        if r.path not in outputs:
            continue
        try:
            write_file(output, outputs[r.path])
        except OSError as exc:
            failures.unwritten([r.path], output, describe_os_error(output, exc))


def _write_outtree(
    results: list[FileResult],
    outputs: dict[str, bytes],
    root: Path,
    outtree: Path,
    failures: _Failures,
) -> None:
    changed = {Path(r.path).relative_to(root): r.path for r in results if r.changed}
    replace = {relative: outputs[path] for relative, path in changed.items() if path in outputs}
    try:
        problems = copy_tree(root, outtree, _SKIP_DIRS, replace)
    except OSError as exc:
        failures.unwritten(list(changed.values()), outtree, describe_os_error(outtree, exc))
        return
    for problem in problems:
        converted = changed.get(problem.path.relative_to(root))
        if converted is not None:
            failures.add(converted, problem.reason)
        else:
            failures.note(problem.path, problem.reason)


def _write_in_place(
    results: list[FileResult],
    texts: dict[str, SourceText],
    outputs: dict[str, bytes],
    backup: bool,
    failures: _Failures,
) -> None:
    """Rewrite each changed file (a link's target), backed up first; unchanged ones are left."""
    for r in results:
        if not r.changed or r.path not in outputs:
            continue
        path = Path(r.path)
        try:
            rewrite_in_place(path, texts[r.path].data, outputs[r.path], backup=backup)
        except WriteRefused as exc:
            failures.add(r.path, str(exc))
        except OSError as exc:
            failures.add(r.path, describe_os_error(path, exc))


def _report(texts: dict[str, SourceText], results: list[FileResult], failures: _Failures) -> Report:
    report = Report()
    converted = {r.path for r in results}
    for path, reason in failures.reasons.items():
        if path not in converted:
            report.files.append(FileOutcome(path, error=reason))
    for r in results:
        report.extend(r.entries)
        report.found.extend(r.found)
        error = failures.reasons.get(r.path)
        changed = r.changed and error is None
        report.files.append(FileOutcome(r.path, changed=changed, error=error, skipped=r.skipped))
    return report


def _write_report(report: Report, report_path: Path) -> bool:
    text = report.render_json() if report_path.suffix == ".json" else report.render_text()
    try:
        write_file(report_path, text.encode("utf-8"))
    except OSError as exc:
        click.echo(f"error: {report_path}: {describe_os_error(report_path, exc)}", err=True)
        return False
    return True
