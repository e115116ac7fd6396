"""``mnify run``: launch a script on N ranks with mpiexec and explain how it failed.

    mnify run -n 4 train_mn.py --epoch 3
    mnify run -n 8 --hostfile hosts train_mn.py
    mnify run -n 8 --host node1:4,node2:4 --watchdog 120 train_mn.py
    mnify run -n 4 --summary-json verdict.json train_mn.py  # the verdict as data, for CI
    mnify run -n 8 --hostfile hosts --dry-run train_mn.py    # the command, for a batch script
    mnify run -n 4 --timeline trace.json train_mn.py  # a Chrome trace of every rank; stragglers
    mnify run -n 2 --verify train_mn.py       # prove the first 3 updates are data-parallel

Everything after SCRIPT belongs to the script; an option mnify does not know before it is a
usage error. Exit status: the job's (mpiexec's, or the status of the rank whose early exit
stranded the others); 128+N when stopped by signal N (SIGINT, SIGTERM, SIGHUP), after every
process of the job is gone; 2 for a usage error (missing script, unreadable hostfile, no mpiexec)
without launching anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from mnify import environment
from mnify.environment import LaunchWiring
from mnify.launch import grow_ranks as grow_ranks_plan
from mnify.launch import timeline_merge
from mnify.launch.command import LaunchSpec, build_command
from mnify.launch.diagnosis import Category, JobFacts, diagnose
from mnify.launch.hosts import (
    HostSlots,
    HostSpecError,
    parse_host_list,
    parse_hostfile,
    total_slots,
)
from mnify.launch.mpiexec import (
    MpiExec,
    MpiExecNotFound,
    describe_mpiexec,
    find_mpiexec,
)
from mnify.launch.runner import run_job
from mnify.launch.verdict import as_data, render_text
from mnify.runtime import debug
from mnify.runtime.verify import DEFAULT_UPDATES
from mnify.runtime.verify.report import VerifyReport
from mnify.runtime.verify.report import render as render_verify
from mnify.runtime.write_net import NetReport
from mnify.runtime.write_net import render as render_write_net


def verify_outcome(lines: list[str], updates: int) -> VerifyReport:
    """Rank 0's report (its last JSON line); an empty one when the job ended without it."""
    for text in reversed(lines):
        try:
            return VerifyReport.from_data(json.loads(text))
        except (ValueError, TypeError):
            continue
    return VerifyReport(updates=0)


def write_net_outcome(lines: list[str]) -> NetReport | None:
    """Rank 0's write net report (its last JSON line); None when none came: the net is off
    (``MNIFY_WRITE_NET=0``), the script made no communicator, or the job did not end normally."""
    for text in reversed(lines):
        try:
            return NetReport.from_data(json.loads(text))
        except (ValueError, TypeError):
            continue
    return None


def _check_environment() -> None:
    """A bad ``MNIFY_*`` value is a usage error, said before any rank starts and stops on it."""
    bad = environment.bad_values()
    if bad:
        _fail("; ".join(bad))


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _launch_tools(mpi_args: Sequence[str], mpiexec_path: str | None) -> tuple[list[str], MpiExec]:
    """The ``--mpi-arg`` words and the mpiexec to launch with (``--mpiexec`` or the one found),
    shared by ``mnify run`` and ``mnify scale``; a usage error ends the command."""
    try:
        extra_args = [arg for chunk in mpi_args for arg in shlex.split(chunk)]
    except ValueError as exc:
        _fail(f"--mpi-arg: {exc}")
    if mpiexec_path is not None:
        resolved = shutil.which(mpiexec_path)
        if resolved is None:
            _fail(f"--mpiexec {mpiexec_path}: not an executable")
        return extra_args, describe_mpiexec(str(resolved))
    try:
        return extra_args, find_mpiexec()
    except MpiExecNotFound as exc:
        _fail(str(exc))


def _read_hosts(hostfile: str | None, hosts: str | None) -> list[HostSlots] | None:
    if hostfile is not None:
        return parse_hostfile(hostfile)
    if hosts is not None:
        return parse_host_list(hosts)
    return None


def _write_summary(path: str, data: dict[str, Any]) -> None:
    """``--summary-json``, written whole (a temporary file, then a rename)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp{os.getpid()}")
    temporary.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, target)


def _phase_directory() -> str:
    """Where a --grow-ranks job keeps its phases' global snapshots: a new folder in the working
    directory (every host of a cluster reads it where the working directory is shared)."""
    import tempfile

    return tempfile.mkdtemp(prefix="mnify-phases-", dir=os.getcwd())


def _exit_status(returncode: int) -> int:
    """mpiexec killed by a signal shows as -SIG from Popen; shells say 128+SIG."""
    return 128 - returncode if returncode < 0 else returncode


@click.command(
    "run",
    context_settings={"allow_interspersed_args": False},
)
@click.option(
    "-n",
    "-np",
    "--np",
    "nprocs",
    type=click.IntRange(min=1),
    required=True,
    help="Number of ranks.",
)
@click.option(
    "--hostfile", type=str, default=None, help="Hostfile ('node1 slots=4' lines; MPICH: 'node1:4')."
)
@click.option("--host", "hosts", type=str, default=None, help="Hosts and slots: node1:4,node2:4.")
@click.option(
    "--watchdog",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Set MNIFY_WATCHDOG_TIMEOUT: collectives fail, not hang.",
)
@click.option("--tag-output", is_flag=True, help="Prefix every rank line with [RANK].")
@click.option(
    "--dry-run", is_flag=True, help="Print the mpiexec command and environment; run nothing."
)
@click.option(
    "--mpi-arg",
    "mpi_args",
    multiple=True,
    metavar="ARGS",
    help="Extra mpiexec arguments, shell-split; repeatable (e.g. '--mca btl tcp,self').",
)
@click.option(
    "-x",
    "--export",
    "exports",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="Also forward this environment variable to every rank; repeatable.",
)
@click.option(
    "--mpiexec",
    "mpiexec_path",
    type=str,
    default=None,
    help=f"The mpiexec to use (default: ${environment.MPIEXEC.name}, the one beside Python, "
    "then PATH).",
)
@click.option(
    "--hold-seconds",
    type=float,
    default=10.0,
    hidden=True,
    help="How long a traceback may stay held back while the job still runs.",
)
@click.option(
    "--abort-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Stop a job whose mpiexec outlives a failed rank by this many seconds.",
)
@click.option(
    "--exit-timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="Stop a job whose rank has exited while another waits for it in a collective (0: never).",
)
@click.option(
    "--summary-json",
    "summary_json",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    metavar="FILE",
    help="Write the verdict (category, culprit ranks, errors, hint) as JSON, also on success.",
)
@click.option(
    "--timeline",
    "timeline_file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    metavar="FILE",
    help="Record every rank's collectives; merge them into a Chrome trace; name stragglers.",
)
@click.option(
    "--timeline-events",
    "timeline_events",
    type=click.IntRange(min=16),
    default=None,
    metavar="N",
    help="Events each rank's timeline keeps (default 131072); older ones are overwritten.",
)
@click.option(
    "--verify",
    "verify",
    is_flag=True,
    help="Check the first updates are data-parallel (same-data, params-differ, "
    "unwrapped-optimizer, rank-writes), then stop every rank; exit 1 with findings.",
)
@click.option(
    "--verify-updates",
    "verify_updates",
    type=click.IntRange(min=1),
    default=None,
    metavar="K",
    help=f"How many updates --verify checks (default {DEFAULT_UPDATES}; implies --verify).",
)
@click.option(
    "--verify-timeout",
    "verify_timeout",
    type=click.FloatRange(min=1),
    default=None,
    metavar="SECONDS",
    help="How long rank 0 waits at the verification stop for a rank before ending the job "
    "naming it (default 120).",
)
@click.option(
    "--grow-ranks",
    "grow_ranks",
    type=str,
    default=None,
    metavar="N@MILESTONE,...",
    help="Relaunch with more ranks at milestones (4@30e,8@60e: epochs; 8@500i: iterations), "
    "resuming each phase from the global snapshot the previous one wrote.",
)
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run(
    nprocs: int,
    hostfile: str | None,
    hosts: str | None,
    watchdog: float | None,
    tag_output: bool,
    dry_run: bool,
    mpi_args: tuple[str, ...],
    exports: tuple[str, ...],
    mpiexec_path: str | None,
    hold_seconds: float,
    abort_timeout: float,
    exit_timeout: float,
    summary_json: str | None,
    timeline_file: str | None,
    timeline_events: int | None,
    verify: bool,
    verify_updates: int | None,
    verify_timeout: float | None,
    grow_ranks: str | None,
    script: str,
    script_args: tuple[str, ...],
) -> None:
    """Run SCRIPT on N ranks with mpiexec; collapse the ranks' tracebacks when it fails."""
    _check_environment()
    if not os.path.isfile(script):
        hint = ""
        if os.path.basename(script).startswith("python") and script_args:
            hint = f" (mnify run takes the script itself: mnify run -n {nprocs} {script_args[0]})"
        _fail(f"script not found: {script}{hint}")
    if hostfile is not None and hosts is not None:
        _fail("give either --hostfile or --host, not both")
    try:
        host_list = _read_hosts(hostfile, hosts)
    except HostSpecError as exc:
        _fail(str(exc))
    if timeline_events is not None and timeline_file is None:
        _fail("--timeline-events sizes the timeline: give --timeline FILE too")
    if verify_timeout is not None and not (verify or verify_updates):
        _fail("--verify-timeout is for --verify: give --verify too")
    growths: list[grow_ranks_plan.Growth] = []
    if grow_ranks is not None:
        if timeline_file is not None or verify or verify_updates:
            _fail(
                "--grow-ranks runs several jobs: --timeline and --verify take one; run them alone"
            )
        try:
            growths = grow_ranks_plan.parse(grow_ranks, nprocs)
        except ValueError as exc:
            _fail(str(exc))
        slots = None if host_list is None else total_slots(host_list)
        if slots is not None and growths[-1].ranks > slots:
            _fail(
                f"--grow-ranks asks for {growths[-1].ranks} ranks but the hosts offer {slots} slots"
            )
    extra_args, mpiexec = _launch_tools(mpi_args, mpiexec_path)
    timeline_dir = None
    if timeline_file is not None:
        timeline_dir = timeline_merge.run_directory(timeline_file)
        exports = (*exports, f"{environment.TIMELINE.name}={timeline_dir}")
    verify_k = verify_updates or (DEFAULT_UPDATES if verify else None)
    if verify_k is not None:
        exports = (*exports, f"{environment.VERIFY.name}={verify_k}")
    spec = LaunchSpec(
        nprocs=nprocs,
        script=script,
        script_args=list(script_args),
        hostfile=hostfile,
        hosts=hosts,
        watchdog=watchdog,
        mpi_args=extra_args,
        export=list(exports),
        tag_ranks=tag_output or not dry_run,
        wiring=LaunchWiring(
            verify_report=verify_k is not None,
            timeline_events=timeline_events,
            verify_timeout=verify_timeout,
        ),
    )
    command = build_command(spec, mpiexec)
    notes = list(command.notes)
    if host_list is not None:
        slots = total_slots(host_list)
        if slots is not None and nprocs > slots:
            notes.append(
                f"{nprocs} ranks but the hosts offer {slots} slots: mpiexec will refuse "
                "(raise the slot counts, or pass --mpi-arg --oversubscribe on purpose)"
            )
        if (
            mpiexec.flavor == "mpich"
            and hostfile
            and any("slots=" in line for line in open(hostfile, encoding="utf-8"))
        ):
            notes.append(f"{hostfile} uses Open MPI's 'slots=' syntax; MPICH expects 'host:N'")
    for note in notes:
        click.echo(f"warning: {note}", err=True)
    if dry_run:
        click.echo(f"# {mpiexec.description}")
        click.echo(command.shell_text())
        return

    if timeline_dir is not None:
        try:
            timeline_merge.prepare_run_directory(timeline_dir)
        except OSError as exc:
            _fail(f"--timeline {timeline_file}: cannot use {timeline_dir}: {exc}")
    phase_dir = _phase_directory() if growths else None
    phases = [None] if phase_dir is None else grow_ranks_plan.plan(nprocs, growths, phase_dir)
    phase_data: list[dict[str, Any]] = []
    for phase in phases:
        if phase is not None:
            nprocs = phase.ranks
            wiring = dataclasses.replace(
                spec.wiring,
                phase_stop=None if phase.stop is None else str(phase.stop),
                phase_snapshot=phase.snapshot,
                phase_resume=phase.resume,
            )
            command = build_command(
                dataclasses.replace(spec, nprocs=nprocs, wiring=wiring), mpiexec
            )
            click.echo(
                f"mnify run: phase {phase.index + 1} of {len(phases)}: {nprocs} ranks"
                + ("" if phase.stop is None else f" until {phase.stop}"),
                err=True,
            )
        try:
            result = run_job(
                command,
                mpiexec.flavor,
                nprocs=nprocs,
                out=sys.stdout,
                err=sys.stderr,
                tag_output=tag_output,
                hold_seconds=hold_seconds,
                abort_timeout=abort_timeout,
                exit_timeout=exit_timeout,
            )
        except OSError as exc:
            _fail(f"cannot start {mpiexec.path}: {exc}")
        if phase is None:
            break
        phase_data.append(grow_ranks_plan.as_data(phase, _exit_status(result.returncode)))
        if result.returncode != 0 or phase.record() is None:
            break  # failed, or the script ended before the milestone: no next phase
    facts = JobFacts(
        nprocs=nprocs,
        exit_status=_exit_status(result.returncode),
        tracebacks=result.tracebacks,
        exit_reports=result.exit_reports,
        launcher_text=result.launcher_text,
        stranded=result.stranded,
        stopped_after_failure=result.stopped_after_failure,
        interrupted_by=result.interrupted_by,
        ranks_heard=result.ranks_heard,
        rerun_one_rank=shlex.join(["mnify", "run", "-n", "1", script, *script_args]),
        debug=debug.enabled(),
        stops=result.stops,
        left_early=result.left_early,
        launcher_outlived_ranks=result.launcher_outlived_ranks,
        launcher_signal=result.launcher_signal,
        vanished=result.vanished,
        exit_statuses=result.exit_statuses,
    )
    verdict = diagnose(facts)
    summary = as_data(verdict)
    if phase_dir is not None:
        if verdict.ok:  # nothing to resume by hand: the phases' snapshots go
            shutil.rmtree(phase_dir, ignore_errors=True)
            for entry in phase_data:
                entry["snapshot"] = None
        else:
            click.echo(f"mnify run: the phases' global snapshots are kept in {phase_dir}", err=True)
        summary["phases"] = phase_data
    if result.stops:
        summary["stop"] = {
            "updates": max(s.updates for s in result.stops),
            "reason": ", ".join(sorted({s.reason for s in result.stops})),
            "ranks": sorted({s.rank for s in result.stops}),
        }
    timeline_lines: list[str] = []
    if timeline_file is not None and timeline_dir is not None:
        merged = timeline_merge.finish_run(timeline_file, timeline_dir, nprocs)
        timeline_lines = merged.lines
        summary["stragglers"] = merged.stragglers
    net = write_net_outcome(result.write_net_reports)
    summary["shared_writes"] = (
        None if net is None else [dataclasses.asdict(w) for w in net.shared_writes]
    )
    net_lines = [] if net is None else render_write_net(net)
    verify_lines: list[str] = []
    if verify_k is not None:
        report = verify_outcome(result.verify_reports, verify_k)
        summary["verify"] = report.as_data()
        verify_lines = render_verify(report, nprocs)
        if verdict.category is Category.STOPPED or verdict.ok:
            verdict.exit_status = 1 if report.findings else 0
            summary["exit_status"] = verdict.exit_status
    if summary_json is not None:
        try:
            _write_summary(summary_json, summary)
        except OSError as exc:
            click.echo(f"warning: --summary-json {summary_json}: {exc}", err=True)
    if verdict.ok or verdict.category is Category.STOPPED:
        for tb in result.tracebacks:  # handled errors printed by a job that still succeeded
            if not tb.shown:
                for line in tb.lines:
                    click.echo(f"[{tb.rank}] {line}" if tag_output else line, err=True)
        for line in timeline_lines + net_lines + grow_ranks_plan.render(phase_data):
            click.echo(line, err=True)
        if verdict.category is Category.STOPPED and not verify_lines:
            click.echo(f"mnify run: {verdict.headline}", err=True)
        for line in verify_lines:
            click.echo(line, err=True)
        sys.exit(verdict.exit_status)
    click.echo("", err=True)
    click.echo(render_text(verdict), err=True)
    for line in net_lines + verify_lines:
        click.echo(line, err=True)
    for line in timeline_lines:
        click.echo(line, err=True)
    sys.exit(verdict.exit_status)
