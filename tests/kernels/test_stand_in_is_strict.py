"""The CuPy stand-in refuses or reorders what CuPy 14 on a GPU would, so the GPU-path tests that
run on it can fail for the reasons a GPU fails (tests/support/fakecupy/cupy/__init__.py).

Each check runs in a fresh interpreter with the stand-in first on the path; it reports the
outcome of each probe as JSON, and the test asserts on that structure.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import fakecupy
from tests.support.mpirun import REPO, mpi_env

PROBES = r"""
import json, sys
sys.path.insert(0, FAKE)
import numpy as np
import cupy

found = {}

def outcome(name, fn):
    try:
        found[name] = ["ok", repr(fn())]
    except Exception as exc:
        found[name] = [type(exc).__name__, str(exc)[:120]]

x = cupy.asarray(np.arange(4.0))
outcome("implicit conversion", lambda: np.asarray(x))
side = cupy.cuda.Stream(non_blocking=True)
y = cupy.zeros(4)
with side:
    y[...] = 7.0
outcome("read without waiting for the writing stream", lambda: cupy.asnumpy(y).tolist())
side.synchronize()
outcome("read after synchronize", lambda: cupy.asnumpy(y).tolist())
a = cupy.empty(100, np.float32)
address = a.data.ptr
del a
outcome("freed block reused by the same stream at once", lambda: cupy.empty(100, np.float32).data.ptr == address)
with side:
    outcome("not by another stream", lambda: cupy.empty(100, np.float32).data.ptr == address)
start, stop = cupy.cuda.Event(), cupy.cuda.Event()
outcome("elapsed time of events never recorded", lambda: cupy.cuda.get_elapsed_time(start, stop))
start.record(); stop.record()
outcome("elapsed time before completion", lambda: cupy.cuda.get_elapsed_time(start, stop))
stop.synchronize()
outcome("elapsed time after completion", lambda: cupy.cuda.get_elapsed_time(start, stop) >= 0)
with cupy.cuda.Device(1):
    other = cupy.cuda.Stream(non_blocking=True)
    on_one = cupy.zeros(3)
outcome("event recorded on another device's stream", lambda: cupy.cuda.Event().record(other))
outcome("array of another device", lambda: on_one + 1)
outcome("cuRAND", lambda: cupy.random.standard_normal(3))
outcome("cuBLAS", lambda: cupy.ones((2, 2)) @ cupy.ones((2, 2)))
print("PROBES " + json.dumps(found))
"""


def test_the_stand_in_behaves_as_a_gpu_where_correctness_depends_on_it() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"FAKE = {str(fakecupy.PATH)!r}\n" + PROBES],
        cwd=REPO,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBES ")]
    found = {name: tuple(v) for name, v in json.loads(line[len("PROBES ") :]).items()}
    assert found["implicit conversion"][0] == "TypeError"
    assert found["read without waiting for the writing stream"] == ("ok", "[0.0, 0.0, 0.0, 0.0]")
    assert found["read after synchronize"] == ("ok", "[7.0, 7.0, 7.0, 7.0]")
    assert found["freed block reused by the same stream at once"] == ("ok", "True")
    assert found["not by another stream"] == ("ok", "False")
    assert found["elapsed time of events never recorded"][0] == "CUDARuntimeError"
    assert "NotReady" in found["elapsed time before completion"][1]
    assert found["elapsed time after completion"] == ("ok", "True")
    assert found["event recorded on another device's stream"][0] == "CUDARuntimeError"
    assert found["array of another device"][0] == "ValueError"
    assert found["cuRAND"][0] == "ImportError" and found["cuBLAS"][0] == "RuntimeError"
