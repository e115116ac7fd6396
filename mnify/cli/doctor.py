"""``mnify doctor``: what this machine has for distributed Chainer, in text or ``--json``.

Exit status 0, or 1 when something required to launch ranks (mpi4py with an MPI library, an
mpiexec, and with ``--hostfile`` a readable hostfile whose host names all resolve) is missing. Missing GPUs, CuPy or Chainer are reported but are not failures: CPU runs
need none of them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from mnify.doctor import collect
from mnify.runtime import mpi_files


def _clean(as_json: bool) -> None:
    """``--clean``: what killed jobs left, removed; exit 1 when some of it could not be."""
    found = mpi_files.find_leftovers()
    removed = set(mpi_files.remove(f.path for f in found))
    if as_json:
        entries = [
            {"path": str(f.path), "kind": f.kind, "bytes": f.bytes, "removed": f.path in removed}
            for f in found
        ]
        click.echo(json.dumps({"leftovers": entries}, indent=2))
    else:
        for f in found:
            state = "removed" if f.path in removed else "could not remove"
            click.echo(f"{state}: {f.path} ({f.kind}, {f.bytes / 2**20:.1f} MiB)")
        total = sum(f.bytes for f in found if f.path in removed) / 2**20
        click.echo(f"{len(removed)} leftover(s) of killed MPI jobs removed, {total:.1f} MiB")
    sys.exit(0 if len(removed) == len(found) else 1)


def _line(console: Console, ok: bool | None, label: str, text: str) -> None:
    mark = {True: "[green]ok[/]", False: "[red]--[/]", None: "[yellow]!![/]"}[ok]
    console.print(f"{mark}  [bold]{label:<9}[/] {escape(text)}", highlight=False, soft_wrap=True)


def render_text(report: dict[str, Any], console: Console) -> None:
    py = report["python"]
    _line(console, True, "python", f"{py['version']} ({py['executable']})")

    m = report["mpi4py"]
    if m["ok"]:
        _line(console, True, "mpi4py", f"{m['version']}, MPI {m['standard']}: {m['library']}")
    else:
        _line(console, False, "mpi4py", f"unusable: {m.get('error')} (required)")

    x = report["mpiexec"]
    _line(console, x["ok"], "mpiexec", x.get("description") or x.get("error", ""))
    if x.get("error") and x.get("description"):
        _line(console, False, "", x["error"])

    h = report["hosts"]
    if h.get("error"):
        _line(console, False, "hosts", h["error"])
    else:
        hosts = ", ".join(
            f"{e['name']} ({e['slots'] if e['slots'] is not None else '?'} slots)"
            for e in h["hosts"]
        )
        total = h["total_slots"] if h["total_slots"] is not None else "unknown"
        _line(
            console,
            not h.get("unresolved"),
            "hosts",
            f"{len(h['hosts'])} host(s), {total} slots: {hosts} [{h['source']}]",
        )
        for entry in h["hosts"]:
            if entry.get("resolves") is False:
                _line(
                    console,
                    False,
                    "",
                    f"{entry['name']} does not resolve ({entry.get('error', 'unknown')}): "
                    "mpiexec reaches hosts by name; fix the name, DNS or /etc/hosts",
                )
        _line(console, True, "", f"this host: {h['cores_here']} cores, {h['cpus_here']} CPUs")

    c = report["chainer"]
    if not c["installed"]:
        _line(
            console,
            None,
            "chainer",
            "not installed (mnify convert/run work without it; training needs it)",
        )
    elif c.get("imports"):
        _line(console, True, "chainer", f"{c['version']}, imports")
    else:
        _line(
            console,
            False,
            "chainer",
            f"{c['version']} installed but does not import: {c.get('error')}",
        )
    _line(
        console,
        report["numpy"]["version"] is not None,
        "numpy",
        report["numpy"]["version"] or "not installed",
    )

    g = report["gpu"]
    if g["nccl_ok"]:
        _line(console, True, "gpu", f"{g['reason']}; pure_nccl available")
    else:
        driver = f"driver sees {g['gpus']} GPU(s)" if g["nvidia_smi"] else g["note"]
        _line(
            console,
            None,
            "gpu",
            f"no GPU run possible: {g['reason']}; {driver}. CPU runs use 'flat' ('naive' under --target chainermn).",
        )

    env = report["forwarded_env"]
    shown = ", ".join(f"{k}={v}" for k, v in env.items()) if env else "none set"
    _line(console, True, "env", f"forwarded to ranks by mnify run: {shown}")
    for hazard in report["hazards"]:
        _line(console, None, "hazard", f"[{hazard['id']}] {hazard['message']}")
    if report["missing"]:
        console.print(f"[red]missing (required):[/] {', '.join(report['missing'])}")


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--hostfile", type=str, default=None, help="Also read this hostfile's hosts and slots."
)
@click.option(
    "--clean",
    is_flag=True,
    help="Remove the /dev/shm segments and TMPDIR/ompi.* directories killed jobs left "
    "(never what a live process holds), list them, and exit.",
)
def doctor(as_json: bool, hostfile: str | None, clean: bool) -> None:
    """Report Python, MPI, mpi4py, mpiexec, hosts, Chainer, numpy, CuPy/CUDA/NCCL and hazards."""
    if clean:
        _clean(as_json)
        return
    report = collect(hostfile)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        render_text(report, Console(highlight=False))
    sys.exit(0 if report["ok"] else 1)
