"""The CUDA sources of this package and the template instantiations mnify uses from them.

Kept free of CuPy so that the compile test (nvcc, no GPU) and the loader
(:mod:`mnify.runtime.kernels.device`, ``cupy.RawModule``) share one list: what CI compiles is
exactly what runs. ``#include "x.cu"`` lines are inlined here rather than passed as ``-I`` so
that CuPy's kernel cache, keyed on the source text, sees header changes too.
"""

from __future__ import annotations

import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent

# source file -> what it provides (headers such as common.cu are only included)
SOURCES: tuple[str, ...] = ("pack.cu", "channel_stats.cu", "channels.cu", "halo.cu")
HEADERS: tuple[str, ...] = ("common.cu",)

# numpy dtype name -> the C type the kernels use for it (float16 travels as raw bits)
FLOAT_CTYPES: dict[str, str] = {"float16": "mn_half", "float32": "float", "float64": "double"}
# element size -> unsigned type used by dtype-agnostic copies
COPY_CTYPES: dict[int, str] = {
    1: "unsigned char",
    2: "unsigned short",
    4: "unsigned int",
    8: "unsigned long long",
}

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def read_source(name: str) -> str:
    """The text of ``name`` with its local ``#include "..."`` lines replaced by the files."""
    seen: set[str] = set()

    def expand(file: str) -> str:
        if file in seen:
            return ""
        seen.add(file)
        text = (KERNEL_DIR / file).read_text(encoding="utf-8")
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(name)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def bucket_copy_name(array_dtype: str, buffer_dtype: str, to_buffer: bool) -> str:
    """pack (``to_buffer``) or unpack kernel for arrays of one dtype and a bucket of another."""
    a, b = FLOAT_CTYPES[array_dtype], FLOAT_CTYPES[buffer_dtype]
    return f"mnify_bucket_copy<{a}, {b}, {_flag(to_buffer)}>"


def channel_sums_name(layout: str, dtype: str, two_inputs: bool) -> str:
    """Per-channel statistics kernel; ``layout`` is ``rows`` (large spatial) or ``cols``."""
    if layout not in ("rows", "cols"):
        raise ValueError(f"unknown layout {layout!r}")
    return f"mnify_channel_sums_{layout}<{FLOAT_CTYPES[dtype]}, {_flag(two_inputs)}>"


def channel_blocks_name(itemsize: int, wide_index: bool, gather: bool) -> str:
    """Channel gather (allgathered blocks -> tensor) or split kernel for one element size."""
    index = "unsigned long long" if wide_index else "unsigned int"
    return f"mnify_channel_blocks<{COPY_CTYPES[itemsize]}, {index}, {_flag(gather)}>"


def halo_rows_name(itemsize: int, wide_index: bool) -> str:
    """Row-block copy (halo pack / unpack) for one element size."""
    index = "unsigned long long" if wide_index else "unsigned int"
    return f"mnify_halo_rows<{COPY_CTYPES[itemsize]}, {index}>"


def _all_names() -> dict[str, list[str]]:
    floats = list(FLOAT_CTYPES)
    return {
        "pack.cu": [
            bucket_copy_name(a, b, to) for a in floats for b in floats for to in (True, False)
        ],
        "channel_stats.cu": [
            channel_sums_name(layout, d, two)
            for layout in ("rows", "cols")
            for d in floats
            for two in (False, True)
        ],
        "channels.cu": [
            channel_blocks_name(size, wide, gather)
            for size in COPY_CTYPES
            for wide in (False, True)
            for gather in (True, False)
        ],
        "halo.cu": [halo_rows_name(size, wide) for size in COPY_CTYPES for wide in (False, True)],
    }


NAME_EXPRESSIONS: dict[str, list[str]] = _all_names()


def instantiation_unit(name: str) -> str:
    """``name``'s source plus a table taking each kernel's address, for an offline nvcc build.

    NVRTC instantiates templates from ``name_expressions``; nvcc needs them referenced in code,
    so this appends exactly the same list.
    """
    refs = ",\n".join(f"  (const void*)&{expr}" for expr in NAME_EXPRESSIONS[name])
    return f"{read_source(name)}\n\nconst void* mnify_instances[] = {{\n{refs}\n}};\n"
