"""The exact ``mpiexec`` command line and environment for a launch.

Kept free of side effects so ``--dry-run`` prints precisely what a real run executes. What it adds
and why:

- ``python -m mnify.launch.bootstrap SCRIPT``: the rank's output is line-buffered, so lines arrive
  as they are printed and whole (``python -u`` writes a line's text and its newline separately,
  and MPICH's ``-prepend-rank`` then tags both halves); and a rank that ends with an uncaught
  exception or a non-zero ``sys.exit`` prints its traceback and calls ``MPI_Abort``, so the
  others do not wait forever in a collective (see :mod:`mnify.launch.bootstrap`). Without the
  bootstrap (``abort_on_error=False``) the script runs under ``python -u``.
- Open MPI run as root refuses to start unless ``OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)`` are set.
- On one host Open MPI gives one slot per core and refuses more ranks; ``--oversubscribe`` is added
  only then. Never with a hostfile or ``--host``: there it would let Open MPI pack every rank onto
  the first host instead of failing loudly.
- ``MNIFY_*``, ``CUDA_VISIBLE_DEVICES`` and ``PYTHONPATH`` reach the ranks on other hosts only when
  forwarded (``-x NAME`` for Open MPI, ``-genv NAME VALUE`` for MPICH); not the per-host and
  launcher-side ones (:data:`mnify.environment.NOT_FORWARDED`).
- ``MNIFY_LAUNCH`` (:class:`mnify.environment.LaunchWiring`) is the launcher's own, never the
  caller's value; forwarded when the spec tells the ranks something (``--verify``, ``mnify
  scale``). The runner adds the rank-state directory to it (:meth:`LaunchCommand.with_wiring`);
  ranks on other hosts that receive it publish nothing there, the host not being theirs.
- Ranks tag their lines (``--tag-output`` / ``-prepend-rank``) so each line can be attributed;
  ``mnify run`` strips the tags again. ``--dry-run`` prints a command for people to run
  themselves, so it tags only when asked (``tag_ranks``).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from mnify import environment
from mnify.environment import LaunchWiring
from mnify.launch.hosts import physical_cores
from mnify.launch.mpiexec import MpiExec

# Variables forwarded to every rank when set: exact names, and prefixes.
FORWARDED_NAMES = ("CUDA_VISIBLE_DEVICES", "PYTHONPATH")
FORWARDED_PREFIXES = ("MNIFY_",)
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclass
class LaunchSpec:
    """What the user asked for: ``mnify run`` options, independent of the MPI flavour."""

    nprocs: int
    script: str
    script_args: list[str] = field(default_factory=list)
    hostfile: str | None = None
    hosts: str | None = None  # "node1:4,node2:4"
    watchdog: float | None = None
    mpi_args: list[str] = field(default_factory=list)  # passed to mpiexec verbatim
    export: list[str] = field(default_factory=list)  # extra NAME or NAME=VALUE to forward
    python: str = sys.executable
    abort_on_error: bool = True  # run through ``python -m mnify.launch.bootstrap``
    tag_ranks: bool = True  # mpiexec tags each line with its rank (mnify run reads the tags)
    wiring: LaunchWiring = field(default_factory=LaunchWiring)  # told to the ranks: MNIFY_LAUNCH

    @property
    def single_host(self) -> bool:
        return self.hostfile is None and self.hosts is None


@dataclass
class LaunchCommand:
    """The argv to execute, and the variables set on top of the caller's environment."""

    argv: list[str]
    env: dict[str, str]  # set or overridden for mpiexec (and forwarded where listed)
    forwarded: list[str]  # names passed on to the ranks explicitly
    inherited: dict[str, str] = field(default_factory=dict)  # forwarded values already set
    notes: list[str] = field(default_factory=list)  # warnings worth showing before the run
    wiring: LaunchWiring = field(default_factory=LaunchWiring)  # what env's MNIFY_LAUNCH says

    def with_wiring(self, wiring: LaunchWiring) -> LaunchCommand:
        """This command telling the ranks ``wiring`` instead (``MNIFY_LAUNCH`` in the
        environment, and in MPICH's ``-genv`` when it is forwarded)."""
        name, text = environment.LAUNCH.name, wiring.to_text()
        argv = list(self.argv)
        for i in range(len(argv) - 2):
            if argv[i] == "-genv" and argv[i + 1] == name:
                argv[i + 2] = text
        env = {**self.env, name: text}
        return dataclasses.replace(self, argv=argv, env=env, wiring=wiring)

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update(self.env)
        return env

    def shell_text(self) -> str:
        """Shell lines that reproduce the launch (``export`` lines, then the command)."""
        shown = {**self.inherited, **self.env}
        lines = [f"export {name}={shlex.quote(value)}" for name, value in shown.items()]
        lines.append(shlex.join(self.argv))
        return "\n".join(lines)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def forwarded_names(environ: Mapping[str, str], extra: list[str]) -> list[str]:
    """Names of the variables to pass to the ranks, sorted, without duplicates."""
    names = {
        name
        for name in environ
        if (name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES))
        and name not in environment.NOT_FORWARDED
    }
    names.update(item.split("=", 1)[0] for item in extra)
    return sorted(names)


def _has_flag(args: list[str], *flags: str) -> bool:
    return any(arg in flags or arg.split("=", 1)[0] in flags for arg in args)


def build_command(
    spec: LaunchSpec,
    mpiexec: MpiExec,
    environ: Mapping[str, str] | None = None,
    *,
    cores: int | None = None,
    is_root: bool | None = None,
) -> LaunchCommand:
    """Translate ``spec`` into the mpiexec command for ``mpiexec``'s flavour.

    ``environ``, ``cores`` and ``is_root`` default to this process's; tests pass their own.
    """
    environ = dict(os.environ if environ is None else environ)
    cores = physical_cores() if cores is None else cores
    is_root = _is_root() if is_root is None else is_root
    if spec.nprocs < 1:
        raise ValueError(f"the number of ranks must be at least 1, got {spec.nprocs}")
    if spec.hostfile is not None and spec.hosts is not None:
        raise ValueError("give either a hostfile or --host, not both")

    env: dict[str, str] = {}
    notes: list[str] = []
    openmpi = mpiexec.flavor == "openmpi"
    if openmpi and is_root:
        env.update(ROOT_ENV)
    if spec.watchdog is not None:
        env[environment.WATCHDOG_TIMEOUT.name] = f"{spec.watchdog:g}"
    for item in spec.export:
        name, sep, value = item.partition("=")
        if sep:
            env[name] = value
        elif name not in environ:
            notes.append(f"--export {name}: not set in this environment, not forwarded")
    if spec.wiring != LaunchWiring():
        env[environment.LAUNCH.name] = spec.wiring.to_text()
    visible = {**environ, **env}
    forwarded = [
        n for n in forwarded_names(visible, spec.export) if n in visible and n not in ROOT_ENV
    ]
    if environment.LAUNCH.name in env:
        forwarded = sorted({*forwarded, environment.LAUNCH.name})

    argv = [mpiexec.path]
    if openmpi:
        if spec.tag_ranks:
            argv.append("--tag-output")
        if (
            spec.single_host
            and spec.nprocs > cores
            and not _has_flag(spec.mpi_args, "--oversubscribe", "-oversubscribe")
        ):
            argv.append("--oversubscribe")
        if spec.hostfile is not None:
            argv += ["--hostfile", spec.hostfile]
        if spec.hosts is not None:
            argv += ["--host", spec.hosts]
        for name in forwarded:
            argv += ["-x", name]
    elif mpiexec.flavor == "mpich":
        if spec.tag_ranks:
            argv.append("-prepend-rank")
        if spec.hostfile is not None:
            argv += ["-f", spec.hostfile]
        if spec.hosts is not None:
            argv += ["-hosts", spec.hosts]
        for name in forwarded:
            argv += ["-genv", name, visible[name]]
    else:
        notes.append(
            f"{mpiexec.path} is neither Open MPI nor MPICH: launching without rank tags, "
            "host options or forwarded variables"
        )
    argv += spec.mpi_args
    argv += ["-n", str(spec.nprocs)]
    argv.append(spec.python)
    argv += ["-m", "mnify.launch.bootstrap"] if spec.abort_on_error else ["-u"]
    argv += [spec.script, *spec.script_args]
    inherited = {name: environ[name] for name in forwarded if name not in env}
    return LaunchCommand(
        argv=argv, env=env, forwarded=forwarded, inherited=inherited, notes=notes,
        wiring=spec.wiring,
    )  # fmt: skip
