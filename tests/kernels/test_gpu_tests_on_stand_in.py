"""The gpu-marked tests' own code runs, on the CuPy/NCCL stand-in, before a GPU ever sees it.

A GPU session has minutes, not hours: a typo in a gpu-marked test must not be found there.
This runs tests/kernels/test_kernels_device.py and tests/gpu in a child pytest with
tests/support/fakecupy first on the path (CuPy arrays are numpy underneath, NCCL calls are done
with MPI on one rank) and the CUDA kernels replaced by their numpy twins. Kernel-vs-twin
comparisons are trivially equal there; the communicator tests exercise pure_nccl for real.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import fakecupy
from tests.support.mpirun import REPO, mpi_env

FAKE = fakecupy.PATH


@pytest.mark.slow
def test_gpu_marked_tests_run_on_the_stand_in() -> None:
    env = mpi_env({"PYTHONPATH": f"{FAKE}:{REPO}"})
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "mnify_fake_device"]
    cmd += ["-q", "-rs", "tests/kernels/test_kernels_device.py", "tests/gpu"]
    cmd += ["-k", "not compiles_on_this_device"]  # needs NVRTC and a real device
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) >= 100, output
    assert "skipped" not in output, output
