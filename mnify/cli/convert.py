"""``mnify convert``: show (or write) the multi-node version of single-GPU Chainer scripts.

By default it prints a unified diff and writes nothing (exit 0); ``--check`` exits 1 when a file
would change; ``-o``, ``--outtree`` and ``--in-place`` write. Files given together (or a
directory) convert as one project. A file that cannot be read as UTF-8 or parsed gets
``error: cannot convert PATH: LINE:COL: reason`` on stderr, the others continue, exit 2.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from mnify.rewrites.driver import FileResult, convert_sources
from mnify.rewrites.options import ConvertOptions
from mnify.rewrites.report import FileOutcome, Report

_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".ruff_cache", "node_modules"}
_BOM = "\ufeff"


def _python_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def _read(path: Path) -> tuple[str | None, str | None]:
    """(text, None) or (None, 'LINE:COL: reason') for a file that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        bad = data[exc.start : exc.start + 1].hex()
        return None, f"{line}:{col}: not UTF-8 (byte 0x{bad}); save the file as UTF-8"


def _write(path: Path, text: str) -> None:
    """Write atomically, so an interrupted run never leaves a truncated file."""
    tmp = path.with_name(f".{path.name}.mnify-tmp")
    tmp.write_bytes(text.encode("utf-8"))
    os.replace(tmp, path)


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
    help="auto: naive on CPU runs, pure_nccl on GPU runs, decided from the script's device flag.",
)
@click.option(
    "--scaling",
    type=click.Choice(["weak", "strong"]),
    default="weak",
    show_default=True,
    help="weak: per-rank batch as written; strong: the global batch is kept (divided by ranks).",
)
@click.option(
    "--model-parallel",
    type=click.Choice(["none", "channel"]),
    default="none",
    show_default=True,
    help="channel: split convolutions' channels over ranks instead of the data.",
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
    if output is not None and (len(src) != 1 or src[0].is_dir()):
        raise click.UsageError("-o takes exactly one source file; use --outtree for directories")
    if outtree is not None:
        if len(src) != 1 or not src[0].is_dir():
            raise click.UsageError("--outtree takes exactly one source directory")
        if outtree.exists():
            raise click.UsageError(f"--outtree {outtree} exists; refusing to overwrite it")
    options = ConvertOptions(
        target=target,  # type: ignore[arg-type]
        communicator=communicator,  # type: ignore[arg-type]
        scaling=scaling,  # type: ignore[arg-type]
        model_parallel=model_parallel,  # type: ignore[arg-type]
    )
    files: list[Path] = []
    for s in src:
        files.extend(_python_files(s) if s.is_dir() else [s])
    report = Report()
    sources: dict[str, str] = {}
    boms: set[str] = set()
    read_errors: dict[str, str] = {}
    for f in files:
        text, err = _read(f)
        if text is None:
            read_errors[str(f)] = err or "unreadable"
            continue
        if text.startswith(_BOM):
            boms.add(str(f))
            text = text[1:]
        sources[str(f)] = text
    tty = sys.stderr.isatty()
    results = _convert_with_progress(sources, options, show=tty and len(sources) > 1)
    failed = False
    for path, err in read_errors.items():
        click.echo(f"error: cannot convert {path}: {err}", err=True)
        report.files.append(FileOutcome(path, error=err))
        failed = True
    use_color = sys.stdout.isatty() if color is None else color
    for r in results:
        report.extend(r.entries)
        report.files.append(
            FileOutcome(r.path, changed=r.changed, error=r.error, skipped=r.skipped)
        )
        if r.error is not None:
            click.echo(f"error: cannot convert {r.path}: {r.error}", err=True)
            failed = True
        elif check and r.changed:
            click.echo(f"would convert {r.path}", err=True)
        elif not modes and not check and r.changed:
            _show_diff(r.diff(), use_color)
    if not check:
        _write_outputs(results, boms, output, outtree, src[0] if src else None, in_place, no_backup)
    for entry in report.sorted_entries():
        if entry.severity == "needs-person":
            click.echo(f"needs a person: {entry.render()}", err=True)
    click.echo(report.summary(), err=True)
    if report_path is not None:
        text = report.render_json() if report_path.suffix == ".json" else report.render_text()
        _write(report_path, text)
    if failed:
        sys.exit(2)
    if check and any(r.changed for r in results):
        sys.exit(1)


def _write_outputs(
    results: list[FileResult],
    boms: set[str],
    output: Path | None,
    outtree: Path | None,
    root: Path | None,
    in_place: bool,
    no_backup: bool,
) -> None:
    def text_of(r: FileResult) -> str:
        assert r.output is not None
        return (_BOM if r.path in boms else "") + r.output

    if output is not None:
        for r in results:
            if r.output is not None:
                _write(output, text_of(r))
    elif outtree is not None and root is not None:
        shutil.copytree(root, outtree, ignore=shutil.ignore_patterns(*_SKIP_DIRS))
        for r in results:
            if r.changed:
                _write(outtree / Path(r.path).relative_to(root), text_of(r))
    elif in_place:
        for r in results:
            if not r.changed:
                continue
            path = Path(r.path)
            if not no_backup:
                shutil.copy2(path, path.with_name(path.name + ".orig"))
            _write(path, text_of(r))
