"""``mnify doctor`` on this machine (text and --json) and its hazard rules on made-up reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import mnify.doctor
from mnify.cli import main
from mnify.doctor import hazards, ptrace_scope
from mnify.launch.hosts import physical_cores
from mnify.launch.mpiexec import MpiExecNotFound


def _has_cupy_gpu() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    result = CliRunner().invoke(main, ["doctor", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_json_reports_this_machines_mpi(report: dict[str, Any]) -> None:
    assert report["ok"] is True and report["missing"] == []
    assert report["mpi4py"]["ok"] and report["mpi4py"]["library"]
    assert report["mpiexec"]["flavor"] in ("openmpi", "mpich")
    assert Path(report["mpiexec"]["path"]).exists()
    assert report["hosts"]["total_slots"] == physical_cores()
    assert report["python"]["version"].count(".") == 2
    assert report["numpy"]["version"]


def test_json_says_why_there_is_no_gpu(report: dict[str, Any]) -> None:
    gpu = report["gpu"]
    if _has_cupy_gpu():
        assert gpu["cuda_devices"] > 0 and gpu["cupy_imports"]
    else:
        assert gpu["nccl_ok"] is False
        assert gpu["reason"]  # CuPy missing, no driver or no device: said, not silent
        assert gpu["cuda_devices"] == 0


def test_text_report_names_every_section() -> None:
    result = CliRunner().invoke(main, ["doctor"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for label in ("python", "mpi4py", "mpiexec", "hosts", "chainer", "numpy", "gpu", "env"):
        assert f"  {label} " in result.stdout, result.stdout
    if not _has_cupy_gpu():
        assert "no GPU run possible" in result.stdout


def test_forwarded_environment_is_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNIFY_WATCHDOG_TIMEOUT", "42")
    monkeypatch.setenv("MNIFY_HOSTNAME", "per-host")
    env = mnify.doctor.collect()["forwarded_env"]
    assert env["MNIFY_WATCHDOG_TIMEOUT"] == "42"
    assert "MNIFY_HOSTNAME" not in env


def test_hostfile_hosts_and_slots_are_reported(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=4\n127.0.0.1 slots=2\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["doctor", "--json", "--hostfile", str(hostfile)])
    assert result.exit_code == 0, result.output
    hosts = json.loads(result.stdout)["hosts"]
    assert hosts["total_slots"] == 6 and hosts["unresolved"] == []
    assert [(h["name"], h["resolves"]) for h in hosts["hosts"]] == [
        ("localhost", True),
        ("127.0.0.1", True),
    ]


def test_a_hostfile_host_that_does_not_resolve_fails_the_doctor(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\nnosuchhost.invalid slots=2\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["doctor", "--json", "--hostfile", str(hostfile)])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["hosts"]["unresolved"] == ["nosuchhost.invalid"]
    assert "hosts" in report["missing"]
    text = CliRunner().invoke(main, ["doctor", "--hostfile", str(hostfile)])
    assert text.exit_code == 1 and "nosuchhost.invalid does not resolve" in text.stdout


def test_missing_mpiexec_fails_the_doctor(monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing() -> None:
        raise MpiExecNotFound("no mpiexec found anywhere")

    monkeypatch.setattr(mnify.doctor, "find_mpiexec", nothing)
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 1
    assert "no mpiexec found anywhere" in result.stdout
    assert "missing (required): mpiexec" in result.stdout


def fake(library: str, numpy: str = "1.26.4", chainer: str | None = "7.8.1",
         mpiexec: str = "openmpi") -> dict[str, Any]:  # fmt: skip
    return {
        "mpi4py": {"library": library},
        "numpy": {"version": numpy},
        "chainer": {"version": chainer},
        "mpiexec": {"flavor": mpiexec, "description": f"{mpiexec} (/x/mpiexec)"},
    }


def ids(report: dict[str, Any]) -> set[str]:
    return {h["id"] for h in hazards(report)}


def test_old_open_mpi_has_the_fork_hazard() -> None:
    found = hazards(fake("Open MPI v2.1.1, package: Open MPI"))
    [fork] = [h for h in found if h["id"] == "openmpi-fork"]
    assert "older than 4.0" in fork["message"] and "InfiniBand" in fork["message"]
    assert "openmpi-fork" not in ids(fake("Open MPI v4.1.5, package: Open MPI"))


def test_numpy_2_with_chainer_7_is_a_hazard() -> None:
    assert "numpy2-chainer7" in ids(fake("Open MPI v5.0.1", numpy="2.1.0"))
    assert "numpy2-chainer7" not in ids(fake("Open MPI v5.0.1", numpy="1.26.4"))
    assert "numpy2-chainer7" not in ids(fake("Open MPI v5.0.1", numpy="2.1.0", chainer=None))


def test_mpi4py_built_for_another_mpi_than_mpiexec_is_a_hazard() -> None:
    assert "mpiexec-mismatch" in ids(fake("MPICH Version: 4.1.2", mpiexec="openmpi"))
    assert "mpiexec-mismatch" not in ids(fake("Open MPI v5.0.11", mpiexec="openmpi"))


def test_multiprocess_iterator_hazard_only_with_open_mpi() -> None:
    assert "openmpi-multiprocess-iterator" not in ids(fake("MPICH Version: 4.1", mpiexec="mpich"))


def test_yama_refusing_ranks_each_others_memory_is_a_hazard(tmp_path: Path) -> None:
    """Ubuntu's default ptrace_scope=1 refuses process_vm_readv between sibling ranks: flat
    loses its single-copy path (and Open MPI its CMA), and the doctor says how to allow it."""
    report = fake("Open MPI v5.0.11")
    assert "ranks-cannot-reach-each-other" not in ids(report)  # no Yama (or unreadable)
    for scope, hazard in ((0, False), (1, True), (3, True)):
        report["hosts"] = {"ptrace_scope": scope}
        assert ("ranks-cannot-reach-each-other" in ids(report)) == hazard, scope
    setting = tmp_path / "ptrace_scope"
    setting.write_text("1\n")
    assert ptrace_scope(str(setting)) == 1
    assert ptrace_scope(str(tmp_path / "absent")) is None


def test_open_mpi_5_with_pmix_5_has_the_finalize_fence_hazard() -> None:
    """The PMIx server bug behind the finalize-fence hang: every Open MPI 5.0.x release we
    know of (bundled PMIx 5.0.x), this machine's wheel included."""
    report = fake("Open MPI v5.0.11, package: Open MPI")
    report["mpi4py"]["pmix"] = "OpenPMIx 5.0.11rc1 (PMIx Standard: 5.1, Stable ABI: 5.0)"
    [fence] = [h for h in hazards(report) if h["id"] == "pmix-finalize-fence"]
    assert "5.0.11rc1" in fence["message"] and "docs/fault-tolerance.md" in fence["message"]
    assert "pmix-finalize-fence" in ids(fake("Open MPI v5.0.3"))  # PMIx unknown: bundled
    report["mpi4py"]["pmix"] = "OpenPMIx 6.0.0"
    assert "pmix-finalize-fence" not in ids(report)
    assert "pmix-finalize-fence" not in ids(fake("Open MPI v4.1.5"))  # ORTE, no PRRTE
    assert "pmix-finalize-fence" not in ids(fake("MPICH Version: 4.1.2", mpiexec="mpich"))


def test_this_machines_pmix_version_is_reported(report: dict[str, Any]) -> None:
    if "Open MPI v5" not in (report["mpi4py"]["library"] or ""):
        pytest.skip("not Open MPI 5")
    assert report["mpi4py"]["pmix"].startswith("OpenPMIx 5.")
    assert "pmix-finalize-fence" in {h["id"] for h in report["hazards"]}


def test_clean_removes_a_dead_jobs_segment_and_keeps_a_held_one(tmp_path: Path) -> None:
    """``mnify doctor --clean`` on the real /dev/shm: a segment nobody maps or holds open (a
    killed job's) goes; one a live process holds open stays."""
    import os
    import subprocess
    import sys
    import time

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    uid = os.getuid()
    dead = shm / f"sm_segment.mnifytest.{uid}.dead{os.getpid():x}.0"
    held = shm / f"sm_segment.mnifytest.{uid}.beef{os.getpid():x}.0"
    for path in (dead, held):
        path.write_bytes(b"\0" * 4096)
        old = time.time() - 3600
        os.utime(path, (old, old))
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time; f = open({str(held)!r}, 'rb'); time.sleep(120)"]
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            os.readlink(f"/proc/{holder.pid}/fd/{fd}") == str(held)
            for fd in os.listdir(f"/proc/{holder.pid}/fd")
        ):
            time.sleep(0.05)
        result = CliRunner().invoke(main, ["doctor", "--clean", "--json"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        listed = {e["path"]: e for e in json.loads(result.stdout)["leftovers"]}
        assert listed[str(dead)]["removed"] and listed[str(dead)]["kind"] == "segment"
        assert str(held) not in listed
        assert not dead.exists() and held.exists()
    finally:
        holder.kill()
        holder.wait()
        for path in (dead, held):
            path.unlink(missing_ok=True)
