"""Every CUDA source compiles with nvcc, with the template instantiations used at run time.

No GPU needed: nvcc builds real device code (SASS through ptxas) for two architectures, so
syntax, template and inline-PTX errors are caught in CI. Skipped, saying why, without nvcc.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mnify.runtime.kernels import sources

NVCC = shutil.which("nvcc")
# PTX for Turing (the oldest arch CUDA 13 targets), assembled for Turing and Hopper (H100/H200)
PTX_ARCH = "compute_75"
SASS_ARCHS = ("sm_75", "sm_90")


def test_every_cu_file_is_listed() -> None:
    on_disk = {p.name for p in sources.KERNEL_DIR.glob("*.cu")}
    assert on_disk == set(sources.SOURCES) | set(sources.HEADERS)


def test_every_kernel_template_has_instantiations() -> None:
    for name in sources.SOURCES:
        text = sources.read_source(name)
        kernels = set(re.findall(r"__global__\s+void\s+(\w+)", text))
        used = {expr.split("<", 1)[0] for expr in sources.NAME_EXPRESSIONS[name]}
        assert kernels == used, f"{name}: kernels {kernels} vs name expressions {used}"


def test_includes_are_inlined_for_nvrtc() -> None:
    for name in sources.SOURCES:
        text = sources.read_source(name)
        assert "#include" not in text, f"{name} would need include paths under NVRTC"
        assert text.count("struct __align__(2) mn_half") <= 1, "common.cu inlined twice"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH: CUDA sources not compiled")
@pytest.mark.parametrize("name", sources.SOURCES)
def test_source_compiles_with_nvcc(name: str, tmp_path: Path) -> None:
    assert NVCC is not None
    unit = tmp_path / name
    unit.write_text(sources.instantiation_unit(name))
    ptx = tmp_path / "unit.ptx"
    _nvcc(["--ptx", f"-arch={PTX_ARCH}", "-Werror", "all-warnings", "-o", str(ptx), str(unit)])
    # one entry point per name expression: the instantiations NVRTC is asked for all exist
    entries = re.findall(r"^\.(?:visible|weak) \.entry (\S+)\(", ptx.read_text(), re.MULTILINE)
    assert len(entries) == len(sources.NAME_EXPRESSIONS[name])
    # ptxas turns the PTX into machine code for each target (catches bad inline PTX, registers)
    for arch in SASS_ARCHS:
        _nvcc(["-cubin", f"-arch={arch}", "-o", str(tmp_path / f"{arch}.cubin"), str(ptx)])


def _nvcc(args: list[str]) -> None:
    assert NVCC is not None
    proc = subprocess.run([NVCC, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nvcc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
