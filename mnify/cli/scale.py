"""``mnify scale``: how much faster a script runs on more ranks, and what costs the rest.

    mnify scale -n 1,2,4 train_mn.py --epoch 100
    mnify scale -n 1,2 --updates 20 --warmup-updates 3 --json scale.json --plot scale.png train.py
    mnify scale -n 4,8 --hostfile hosts train_mn.py

Each count runs the script (any script using mnify.runtime) under ``mnify run``'s launcher and
stops every rank after the warm-up and measured updates, whatever its epoch count. Everything
after SCRIPT belongs to the script. Exit status: 0 when every count was measured, 1 when a run
failed or made too few updates, 2 for a usage error. See docs/scale.md.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from mnify import environment
from mnify.cli.run import _check_environment, _fail, _launch_tools, _read_hosts, verify_outcome
from mnify.environment import LaunchWiring
from mnify.launch.command import LaunchSpec, build_command
from mnify.launch.hosts import HostSpecError
from mnify.launch.runner import run_job


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"-n {text}: expected rank counts separated by commas, e.g. 1,2,4")
    if not counts or any(c < 1 for c in counts):
        _fail(f"-n {text}: every rank count must be 1 or more")
    return sorted(set(counts))


@click.command("scale", context_settings={"allow_interspersed_args": False})
@click.option("-n", "counts_text", required=True, metavar="N,N,...", help="Rank counts: 1,2,4.")
@click.option(
    "--updates", type=click.IntRange(min=2), default=30, show_default=True, help="Updates measured."
)
@click.option(
    "--warmup-updates",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Updates run first and not measured.",
)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="Write the measurements and causes as JSON.")  # fmt: skip
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), default=None,
              metavar="FILE.png", help="Draw the breakdown and the speed-up (matplotlib).")  # fmt: skip
@click.option(
    "--hostfile", type=str, default=None, help="Hostfile ('node1 slots=4' lines; MPICH: 'node1:4')."
)
@click.option("--host", "hosts", type=str, default=None, help="Hosts and slots: node1:4,node2:4.")
@click.option("--watchdog", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="Set MNIFY_WATCHDOG_TIMEOUT: collectives fail, not hang.")  # fmt: skip
@click.option("--mpi-arg", "mpi_args", multiple=True, metavar="ARGS",
              help="Extra mpiexec arguments, shell-split; repeatable.")  # fmt: skip
@click.option("-x", "--export", "exports", multiple=True, metavar="NAME[=VALUE]",
              help="Also forward this environment variable to every rank; repeatable.")  # fmt: skip
@click.option("--mpiexec", "mpiexec_path", type=str, default=None,
              help=f"The mpiexec to use (default: ${environment.MPIEXEC.name}, the one beside Python, then PATH).")  # fmt: skip
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def scale(
    counts_text: str,
    updates: int,
    warmup_updates: int,
    json_file: str | None,
    plot_file: str | None,
    hostfile: str | None,
    hosts: str | None,
    watchdog: float | None,
    mpi_args: tuple[str, ...],
    exports: tuple[str, ...],
    mpiexec_path: str | None,
    script: str,
    script_args: tuple[str, ...],
) -> None:
    """Run SCRIPT at each rank count; report the speed-up, where each step goes, and why."""
    from mnify.launch import scale as measuring

    counts = _counts(counts_text)
    _check_environment()
    if hostfile is not None and hosts is not None:
        _fail("give either --hostfile or --host, not both")
    try:
        _read_hosts(hostfile, hosts)
    except HostSpecError as exc:
        _fail(str(exc))
    if plot_file is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _fail("--plot needs matplotlib: pip install 'mnify[plot]'")
    extra_args, mpiexec = _launch_tools(mpi_args, mpiexec_path)
    if not os.path.isfile(script):
        _fail(f"script not found: {script}")

    def launch(
        n: int, env: dict[str, str], scale_updates: int | None, verify: int | None, log: Any
    ) -> Any:
        extra = [f"{k}={v}" for k, v in env.items()]
        if verify is not None:
            extra.append(f"{environment.VERIFY.name}={verify}")
        wiring = LaunchWiring(verify_report=verify is not None, scale_updates=scale_updates)
        spec = LaunchSpec(
            nprocs=n,
            script=script,
            script_args=list(script_args),
            hostfile=hostfile,
            hosts=hosts,
            watchdog=watchdog,
            mpi_args=extra_args,
            export=[*exports, *extra],
            wiring=wiring,
        )
        result = run_job(build_command(spec, mpiexec), mpiexec.flavor, nprocs=n, out=log, err=log)
        status = result.returncode
        findings = None
        if verify is not None and result.verify_reports:
            report = verify_outcome(result.verify_reports, verify)
            findings = [(f.check, list(f.ranks)) for f in report.findings]
        return measuring.Launched(128 - status if status < 0 else status, result.stops, findings)

    def say(line: str) -> None:
        click.echo(line, err=True)

    try:
        runs = measuring.measure(counts, launch, warmup=warmup_updates, updates=updates, say=say)
    except measuring.ScaleError as exc:
        click.echo(f"mnify scale: {exc}", err=True)
        sys.exit(1)
    found = measuring.causes(runs)
    for line in measuring.render(runs, found, warmup_updates, updates):
        click.echo(line)
    if json_file is not None:
        with open(json_file, "w", encoding="utf-8") as f:
            json.dump(measuring.as_data(runs, found), f, indent=2)
            f.write("\n")
    if plot_file is not None:
        measuring.plot(runs, plot_file)
        click.echo(f"mnify scale: plot written to {plot_file}")
