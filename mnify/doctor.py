"""``mnify doctor``'s facts: what this machine has for running distributed Chainer, and the traps.

Each probe runs in its own Python subprocess (``mpi4py``, Chainer, CuPy): importing a broken MPI,
Chainer on numpy 2, or CUDA without a driver can crash or hang a process, and the report must
still come out. The probes are independent and run in parallel.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from mnify.launch.command import forwarded_names
from mnify.launch.hosts import (
    HostSlots,
    HostSpecError,
    parse_hostfile,
    physical_cores,
    resolve_hosts,
    this_host,
)
from mnify.launch.hosts import total_slots as _total_slots
from mnify.launch.mpiexec import MpiExec, MpiExecNotFound, find_mpiexec

PROBE_TIMEOUT = 60.0

# mpi4py without MPI_Init: the library version may be asked before initialisation (MPI-3).
# PMIx's version from the libpmix the MPI library loaded (Open MPI 5 links it), when it did.
_MPI_PROBE = """
import ctypes, json, re, mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
pmix = None
try:
    libs = sorted(set(re.findall(r"(/\\S*libpmix\\.so\\S*)", open("/proc/self/maps").read())))
    if libs:
        get = ctypes.CDLL(libs[0]).PMIx_Get_version
        get.restype = ctypes.c_char_p
        pmix = get().decode()
except Exception:
    pass
print(json.dumps({"mpi4py": mpi4py.__version__,
                  "library": MPI.Get_library_version().replace("\\x00", "").strip(),
                  "standard": "%d.%d" % MPI.Get_version(), "pmix": pmix}))
"""
_CHAINER_PROBE = """
import json, chainer
print(json.dumps({"version": chainer.__version__}))
"""
# Prefer the runtime's own check (the one create_communicator('pure_nccl') relies on).
_CUPY_PROBE = """
import json
import mpi4py
mpi4py.rc.initialize = False
out = {}
try:
    from mnify.runtime.communicators.pure_nccl import nccl_status
except Exception:
    nccl_status = None
try:
    import cupy
    out["version"] = cupy.__version__
    try:
        out["devices"] = int(cupy.cuda.runtime.getDeviceCount())
        out["cuda_runtime"] = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception as exc:
        out["device_error"] = "%s: %s" % (type(exc).__name__, exc)
except Exception as exc:
    out["import_error"] = "%s: %s" % (type(exc).__name__, exc)
if nccl_status is not None:
    ok, why = nccl_status()
elif "import_error" in out:
    ok, why = False, "CuPy is not importable (%s); install cupy-cudaXXx" % out["import_error"]
elif out.get("devices", 0) == 0:
    ok, why = False, "CuPy %s sees no CUDA device (%s)" % (out["version"], out.get("device_error", "0 devices"))
else:
    try:
        from cupy.cuda import nccl
        ok = bool(getattr(nccl, "available", False))
        why = "NCCL available" if ok else "CuPy was built without NCCL"
    except Exception as exc:
        ok, why = False, "no NCCL binding in CuPy (%s)" % exc
out["nccl_ok"], out["reason"] = ok, why
print(json.dumps(out))
"""


@dataclass
class Probe:
    """The outcome of a probe subprocess: its JSON answer, or why there is none."""

    ok: bool
    data: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def _start_probe(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def _finish_probe(proc: subprocess.Popen[str]) -> Probe:
    try:
        out, err = proc.communicate(timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Probe(False, error=f"the probe hung for {PROBE_TIMEOUT:g} s and was killed")
    if proc.returncode != 0:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {proc.returncode}"
        return Probe(False, error=reason)
    try:
        return Probe(True, json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return Probe(False, error=f"unreadable probe output: {out[-200:]!r}")


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cupy_distribution() -> str | None:
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name == "cupy" or name.startswith("cupy-"):
            return f"{dist.metadata['Name']} {dist.version}"
    return None


def _major(version: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", version or "")
    return int(match.group(1)) if match else None


def _openmpi_version(library: str) -> str | None:
    """``"Open MPI v5.0.11, package: ..."`` -> ``"5.0.11"``."""
    match = re.search(r"Open MPI v?(\d+(?:\.\d+)*)", library)
    return match.group(1) if match else None


def _pmix_version(text: str) -> str | None:
    """``"OpenPMIx 5.0.11rc1 (PMIx Standard: 5.1, ...)"`` -> ``"5.0.11rc1"``."""
    match = re.search(r"PMIx v?(\d+(?:\.\d+)*\w*)", text)
    return match.group(1) if match else None


def _library_flavor(library: str) -> str:
    lowered = library.lower()
    if "open mpi" in lowered:
        return "openmpi"
    if "mpich" in lowered or "intel(r) mpi" in lowered or "mvapich" in lowered:
        return "mpich"
    return "unknown"


def _gpus_by_driver() -> dict[str, Any]:
    """What ``nvidia-smi -L`` lists: GPUs the driver sees, independent of CuPy."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"nvidia_smi": None, "gpus": 0, "note": "nvidia-smi not found (no NVIDIA driver)"}
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"nvidia_smi": exe, "gpus": 0, "note": f"nvidia-smi failed: {exc}"}
    gpus = [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    note = "" if proc.returncode == 0 else (proc.stderr or proc.stdout).strip()[:200]
    return {"nvidia_smi": exe, "gpus": len(gpus), "note": note}


# Yama's setting: 1 and up refuse process_vm_readv/writev between the ranks of a node
_PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


def hazards(report: dict[str, Any]) -> list[dict[str, str]]:
    """Known traps for this combination of versions, each with an id and what to do."""
    found: list[dict[str, str]] = []
    library = report["mpi4py"].get("library") or ""
    ompi = _openmpi_version(library)
    if ompi is not None and (_major(ompi) or 0) < 4:
        found.append(
            {
                "id": "openmpi-fork",
                "message": (
                    f"Open MPI {ompi} is older than 4.0: a fork() in a rank after MPI_Init "
                    "(subprocess, os.system, DumpGraph calling dot, MultiprocessIterator workers "
                    "started with 'fork') can corrupt memory or abort the rank with signal 6 when "
                    "InfiniBand (openib/verbs) is in use. Avoid fork in ranks; from Open MPI 3 "
                    "multiprocessing.set_start_method('forkserver') before the communicator works "
                    "around it for MultiprocessIterator, on Open MPI 2 it does not."
                ),
            }
        )
    if ompi is not None:
        method = (
            multiprocessing.get_start_method(allow_none=True)
            or (multiprocessing.get_all_start_methods()[0])
        )
        if method == "fork":
            found.append(
                {
                    "id": "openmpi-multiprocess-iterator",
                    "message": (
                        "Open MPI with Chainer's MultiprocessIterator: Python's default start method "
                        "here is 'fork', so its workers are forked from a rank after MPI_Init. Open MPI's "
                        "own warning says the job may then hang, crash or silently corrupt data "
                        "(above all with InfiniBand/verbs transports). Call "
                        "multiprocessing.set_start_method('forkserver') and start one dummy process "
                        "before creating the communicator (mnify convert inserts this), or use "
                        "SerialIterator/MultithreadIterator."
                    ),
                }
            )
    pmix = _pmix_version(report["mpi4py"].get("pmix") or "")
    if ompi is not None and (_major(ompi) or 0) == 5 and (pmix is None or _major(pmix) == 5):
        found.append(
            {
                "id": "pmix-finalize-fence",
                "message": (
                    f"Open MPI {ompi} with PMIx {pmix or '5.0.x (bundled)'}: a rank that dies "
                    "while another rank already waits in MPI_Finalize can leave prterun "
                    "deadlocked or crashed after every rank is gone (its PMIx server completes "
                    "the finalize fence twice). Measured on Open MPI 5.0.11 / PMIx 5.0.11; no "
                    "released version is known to carry the upstream fixes (see "
                    "docs/fault-tolerance.md). mnify's exit barrier keeps ranks out of the fence "
                    "until all have left their scripts, and mnify run ends a launcher that "
                    "outlives its ranks; plain mpiexec runs stay exposed."
                ),
            }
        )
    numpy_version = report["numpy"].get("version")
    chainer_version = report["chainer"].get("version")
    if (
        _major(numpy_version) is not None
        and (_major(numpy_version) or 0) >= 2
        and (_major(chainer_version) == 7)
    ):
        found.append(
            {
                "id": "numpy2-chainer7",
                "message": (
                    f"numpy {numpy_version} with Chainer {chainer_version}: Chainer 7 predates numpy 2 "
                    "and breaks with it (removed aliases such as numpy.bool8). Install numpy<2."
                ),
            }
        )
    mpiexec_flavor = report["mpiexec"].get("flavor")
    lib_flavor = _library_flavor(library) if library else None
    if (
        lib_flavor
        and mpiexec_flavor
        and "unknown" not in (lib_flavor, mpiexec_flavor)
        and (lib_flavor != mpiexec_flavor)
    ):
        found.append(
            {
                "id": "mpiexec-mismatch",
                "message": (
                    f"mpi4py uses {library.split(',')[0]} but mpiexec is {report['mpiexec']['description']}:"
                    " every rank will start as rank 0 of 1. Use the mpiexec of the MPI mpi4py was built"
                    " with (MNIFY_MPIEXEC or --mpiexec), or rebuild mpi4py against this MPI."
                ),
            }
        )
    scope = report.get("hosts", {}).get("ptrace_scope")
    if isinstance(scope, int) and scope >= 1:
        found.append(
            {
                "id": "ranks-cannot-reach-each-other",
                "message": (
                    f"Yama's ptrace_scope is {scope}: ranks on one node cannot read or write each "
                    "other's memory (cross-memory attach is refused between sibling processes). "
                    "flat then averages through its shared-memory segment only, without the "
                    "single-copy path it would time against it, and Open MPI's own single-copy "
                    "transport (smsc/cma) is off too. As root, `sysctl kernel.yama.ptrace_scope=0` "
                    "allows both (a security trade-off on shared machines)."
                ),
            }
        )
    return found


def ptrace_scope(path: str = _PTRACE_SCOPE) -> int | None:
    """Yama's ``ptrace_scope`` (0: any process of the user may attach), None without Yama."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _hosts_section(hostfile: str | None) -> dict[str, Any]:
    cores = physical_cores()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if hostfile is not None:
        try:
            hosts: list[HostSlots] = parse_hostfile(hostfile)
        except HostSpecError as exc:
            return {
                "source": f"hostfile {hostfile}",
                "error": str(exc),
                "hosts": [],
                "total_slots": None,
                "cores_here": cores,
                "cpus_here": cpus,
            }
        source = f"hostfile {hostfile}"
        resolved = resolve_hosts([h.name for h in hosts])
    else:
        hosts = [this_host()]
        source = "this host (no hostfile): one slot per core"
        resolved = None
    entries = [asdict(h) for h in hosts]
    if resolved is not None:  # mpiexec reaches a hostfile's hosts by name
        for entry, r in zip(entries, resolved, strict=True):
            entry.update({"resolves": r.address is not None, "address": r.address})
            if r.error:
                entry["error"] = r.error
    return {
        "source": source,
        "hosts": entries,
        "total_slots": _total_slots(hosts),
        "unresolved": [r.name for r in resolved or [] if r.address is None],
        "cores_here": cores,
        "cpus_here": cpus,
    }


def collect(hostfile: str | None = None) -> dict[str, Any]:
    """Everything ``mnify doctor`` reports, as plain JSON-ready data; ``ok`` is False when
    something required (mpi4py with a working MPI library, an mpiexec) is missing."""
    mpi_proc = _start_probe(_MPI_PROBE)
    chainer_proc = _start_probe(_CHAINER_PROBE) if _dist_version("chainer") else None
    cupy_proc = _start_probe(_CUPY_PROBE)

    report: dict[str, Any] = {
        "python": {"version": platform.python_version(), "executable": sys.executable},
    }
    try:
        mpiexec: MpiExec | None = find_mpiexec()
    except MpiExecNotFound as exc:
        mpiexec = None
        report["mpiexec"] = {"ok": False, "error": str(exc)}
    if mpiexec is not None:
        report["mpiexec"] = {
            "ok": mpiexec.flavor != "unknown",
            "path": mpiexec.path,
            "flavor": mpiexec.flavor,
            "version": mpiexec.version,
            "description": mpiexec.description,
        }
        if mpiexec.flavor == "unknown":
            report["mpiexec"]["error"] = f"not recognised as Open MPI or MPICH: {mpiexec.banner}"
    report["hosts"] = _hosts_section(hostfile)
    report["hosts"]["ptrace_scope"] = ptrace_scope()  # this node's; others may differ

    mpi = _finish_probe(mpi_proc)
    report["mpi4py"] = {
        "ok": mpi.ok,
        "version": mpi.data.get("mpi4py") or _dist_version("mpi4py"),
        # first line only: MPICH's answer runs to a dozen lines of build details
        "library": (mpi.data.get("library") or "").splitlines()[0] if mpi.ok else None,
        "library_details": mpi.data.get("library"),
        "standard": mpi.data.get("standard"),
        "pmix": mpi.data.get("pmix"),
    }
    if not mpi.ok:
        report["mpi4py"]["error"] = mpi.error

    chainer_version = _dist_version("chainer")
    report["chainer"] = {"installed": chainer_version is not None, "version": chainer_version}
    if chainer_proc is not None:
        chainer = _finish_probe(chainer_proc)
        report["chainer"]["imports"] = chainer.ok
        if not chainer.ok:
            report["chainer"]["error"] = chainer.error
    report["numpy"] = {"version": _dist_version("numpy")}

    cupy = _finish_probe(cupy_proc)
    data = cupy.data
    gpu: dict[str, Any] = {
        "cupy": _cupy_distribution(),
        "cupy_imports": cupy.ok and "import_error" not in data,
        "cuda_devices": data.get("devices", 0),
        "cuda_runtime": data.get("cuda_runtime"),
        "nccl_ok": bool(data.get("nccl_ok")),
        "reason": data.get("reason") or cupy.error,
    }
    gpu.update(_gpus_by_driver())
    report["gpu"] = gpu
    report["forwarded_env"] = {name: os.environ[name] for name in forwarded_names(os.environ, [])}
    report["hazards"] = hazards(report)
    missing = [name for name in ("mpi4py", "mpiexec") if not report[name].get("ok")]
    if report["hosts"].get("error") or report["hosts"].get("unresolved"):
        missing.append("hosts")  # a hostfile was given: its hosts are required
    report["missing"] = missing
    report["ok"] = not missing
    return report
