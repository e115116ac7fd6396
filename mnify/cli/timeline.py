"""``mnify timeline``: merge the ranks' timeline files, report stragglers, draw waiting time.

    mnify timeline --merge DIR -o trace.json    # a job started with plain mpiexec and
                                                # MNIFY_TIMELINE=DIR (mpiexec -x MNIFY_TIMELINE)
    mnify timeline trace.json                   # the straggler report of a merged trace
    mnify timeline trace.json --plot wait.png   # per-rank waiting time per step (matplotlib)

``mnify run --timeline trace.json`` does the merge and the report itself. Exit status 0; 2 for a
usage error, a directory missing ranks' files (they are named), an unreadable file, or
``--plot`` without matplotlib (``pip install 'mnify[plot]'``).
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from mnify.launch import attribution, batch_phases, stragglers
from mnify.launch.timeline_merge import MergeError, load_trace, merge_directory, write_trace


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def plot_waiting(trace: dict[str, Any], path: str) -> None:
    """Draw each rank's waiting time at collectives per step into ``path`` (PNG, SVG, PDF)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    waiting = stragglers.waiting_per_step(trace)
    report = stragglers.analyze(trace)
    named = {s.rank for s in report.stragglers}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for rank in sorted(waiting):
        steps = sorted(waiting[rank])
        label = f"rank {rank}" + (" (straggler)" if rank in named else "")
        ax.plot(steps, [waiting[rank][s] for s in steps], label=label, linewidth=1.2)
    ax.set_xlabel("step (optimizer updates)")
    ax.set_ylabel("waiting at collectives (ms)")
    ax.set_title("Time each rank waited for the last rank to arrive")
    ax.grid(True, alpha=0.3)
    if waiting:
        ax.legend(loc="upper right", fontsize="small", ncol=max(1, len(waiting) // 8))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command("timeline")
@click.argument("trace_file", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--merge",
    "merge_dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Merge the rank-R.timeline files in DIR (MNIFY_TIMELINE=DIR) into -o FILE.",
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), default=None, help="The merged trace."
)
@click.option(
    "--allow-missing", is_flag=True, help="Merge the ranks whose files are there; name the rest."
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="IMAGE",
    help="Draw per-rank waiting time per step (needs matplotlib: mnify[plot]).",
)
def timeline(
    trace_file: str | None,
    merge_dir: str | None,
    output: str | None,
    allow_missing: bool,
    plot: str | None,
) -> None:
    """Merge per-rank timelines into a Chrome trace; report stragglers; plot waiting time."""
    if (trace_file is None) == (merge_dir is None):
        _fail("give a merged trace FILE, or --merge DIR -o FILE")
    if merge_dir is not None and output is None:
        _fail("--merge DIR needs -o FILE (the merged trace)")
    if merge_dir is None and output is not None:
        _fail("-o goes with --merge DIR")
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _fail("--plot needs matplotlib: pip install 'mnify[plot]'")
    try:
        if merge_dir is not None:
            assert output is not None
            merged = merge_directory(merge_dir, allow_missing=allow_missing)
            write_trace(output, merged.trace)
            trace = merged.trace
            events = sum(1 for ev in trace["traceEvents"] if ev["ph"] == "X")
            click.echo(f"wrote {output}: {events} events of ranks {_ranks(merged.ranks)}")
            for warning in merged.warnings:
                click.echo(f"warning: {warning}", err=True)
            if merged.missing:
                click.echo(f"warning: no timeline from ranks {_ranks(merged.missing)}", err=True)
        else:
            assert trace_file is not None
            trace = load_trace(trace_file)
    except MergeError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{output}: {exc.strerror or exc}")
    for line in stragglers.render(stragglers.analyze(trace)):
        click.echo(line)
    for line in attribution.render(attribution.attribute(trace)):
        click.echo(line)
    for line in batch_phases.render(batch_phases.phases(trace), "mnify timeline:"):
        click.echo(line)
    if plot is not None:
        try:
            plot_waiting(trace, plot)
        except (OSError, ValueError) as exc:
            _fail(f"--plot {plot}: {exc}")
        click.echo(f"wrote {plot}")


def _ranks(ranks: list[int]) -> str:
    from mnify.runtime.errors import format_ranks

    return format_ranks(ranks)
