"""Every CUDA source compiles with nvcc and with NVRTC, with the template instantiations used
at run time.

No GPU needed: nvcc builds real device code (SASS through ptxas) for two architectures, so
syntax, template and inline-PTX errors are caught in CI; NVRTC (what CuPy compiles with) checks
that the sources need no headers and that every name expression resolves. Each test skips,
saying why, where its compiler is missing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
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


def _find_nvrtc() -> str | None:
    """libnvrtc from $MNIFY_NVRTC_LIB, the nvidia-cuda-nvrtc wheel, or the system."""
    explicit = os.environ.get("MNIFY_NVRTC_LIB")
    if explicit:
        return explicit
    for entry in sys.path:
        for lib in sorted(Path(entry).glob("nvidia/*/lib/libnvrtc.so*")):
            if "builtins" not in lib.name:
                return str(lib)
    return ctypes.util.find_library("nvrtc")


def _load_nvrtc(path: str) -> ctypes.CDLL:
    """NVRTC, with the ``libnvrtc-builtins`` beside it loaded first: NVRTC opens that library by
    name when it compiles, and a wheel's directory (nvidia/cuda_nvrtc/lib) is not on the
    loader's path, so without the preload every compile fails with "builtins not found"."""
    here = Path(path).parent
    for builtins in sorted(here.glob("libnvrtc-builtins*.so*")):
        ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        break
    return ctypes.CDLL(path)


NVRTC = _find_nvrtc()


@pytest.mark.skipif(
    NVRTC is None,
    reason="no NVRTC library (pip install nvidia-cuda-nvrtc, or set MNIFY_NVRTC_LIB)",
)
@pytest.mark.parametrize("name", sources.SOURCES)
def test_source_compiles_with_nvrtc_like_cupy(name: str) -> None:
    """What cupy.RawModule does at run time: NVRTC, no include paths, the name expressions."""
    assert NVRTC is not None
    lib = _load_nvrtc(NVRTC)
    prog = ctypes.c_void_p()
    code = sources.read_source(name).encode()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), code, name.encode(), 0, None, None) == 0
    try:
        for expr in sources.NAME_EXPRESSIONS[name]:
            assert lib.nvrtcAddNameExpression(prog, expr.encode()) == 0
        options = (ctypes.c_char_p * 1)(f"-arch={PTX_ARCH}".encode())
        rc = lib.nvrtcCompileProgram(prog, 1, options)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        assert rc == 0, f"NVRTC failed on {name}:\n{log.value.decode(errors='replace')}"
        for expr in sources.NAME_EXPRESSIONS[name]:
            lowered = ctypes.c_char_p()
            assert lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(lowered)) == 0
            assert lowered.value and lowered.value.startswith(b"_Z"), expr
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH: CUDA sources not compiled")
def test_bench_spin_kernel_compiles_with_nvcc(tmp_path: Path) -> None:
    """bench/spin.cu (bench/overlap_gpu.py's stand-in for backward, loaded with
    cupy.RawKernel by name) builds for every target and exports its C name."""
    spin = Path(__file__).resolve().parents[2] / "bench" / "spin.cu"
    ptx = tmp_path / "spin.ptx"
    _nvcc(["--ptx", f"-arch={PTX_ARCH}", "-Werror", "all-warnings", "-o", str(ptx), str(spin)])
    entries = re.findall(r"^\.(?:visible|weak) \.entry (\S+)\(", ptx.read_text(), re.MULTILINE)
    assert entries == ["mnify_bench_spin"], entries
    for arch in SASS_ARCHS:
        _nvcc(["-cubin", f"-arch={arch}", "-o", str(tmp_path / f"{arch}.cubin"), str(ptx)])
