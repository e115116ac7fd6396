"""How long ``mnify convert`` takes against what libcst itself needs for the same files.

Generates 200 Chainer training scripts (variants of the converter fixtures) in a temporary
directory and times, on the same files in the same run:

* baseline: libcst parse + ``QualifiedNameProvider`` resolution + code generation;
* convert: the whole conversion (parse, one resolution, all rewrites, code generation,
  re-parse and compile of the output).

Prints files per second and the ratio convert / baseline (goal: at most 1.5). The two sides
are timed file by file, interleaved, ``--repeat`` times; the fastest total of each counts, since
the machine is shared.

    .venv/bin/python bench/convert.py [--files 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import re
import tempfile
import time
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from mnify.rewrites import ConvertOptions, convert_sources

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "convert"

EXTRA = '''

def helper_{i}(values, scale={i}):
    """Padding that varies the size of generated scripts."""
    total = 0
    for v in values:
        total += v * scale
    return total
'''


def templates() -> list[str]:
    files = sorted(FIXTURES.glob("*.in.py")) + sorted((FIXTURES / "dcgan" / "in").glob("*.py"))
    return [f.read_text(encoding="utf-8") for f in files]


def generate(directory: Path, n: int) -> list[Path]:
    """``n`` distinct scripts: fixtures with changed defaults and varying padding."""
    bases = templates()
    paths = []
    for i in range(n):
        text = bases[i % len(bases)]
        text = re.sub(r"default=(\d+)", lambda m, i=i: f"default={int(m.group(1)) + i}", text)
        text += "".join(EXTRA.format(i=i * 10 + k) for k in range(i % 4))
        path = directory / f"script_{i:03d}.py"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def libcst_alone(source: str) -> None:
    module = cst.parse_module(source)
    MetadataWrapper(module, unsafe_skip_copy=True).resolve(QualifiedNameProvider)
    _ = module.code


def mnify_convert(path: Path, source: str, options: ConvertOptions) -> None:
    (result,) = convert_sources({str(path): source}, options)
    assert result.error is None, result.error


def measure(paths: list[Path], sources: list[str], repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` totals, the two sides interleaved file by file.

    The machine is shared: interleaving makes both sides see the same load.
    """
    options = ConvertOptions()
    best_base = best_conv = float("inf")
    for _ in range(repeat):
        base = conv = 0.0
        for path, source in zip(paths, sources, strict=True):
            gc.collect()  # neither side pays for collecting the other's garbage
            t0 = time.perf_counter()
            libcst_alone(source)
            t_base = time.perf_counter()
            gc.collect()
            t1 = time.perf_counter()
            mnify_convert(path, source, options)
            t2 = time.perf_counter()
            base += t_base - t0
            conv += t2 - t1
        best_base, best_conv = min(best_base, base), min(best_conv, conv)
    return best_base, best_conv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = generate(Path(tmp), args.files)
        sources = [p.read_text(encoding="utf-8") for p in paths]
        lines = sum(s.count("\n") for s in sources)
        base, conv = measure(paths, sources, args.repeat)
    print(f"{args.files} scripts, {lines} lines")
    print(f"libcst parse+resolve+codegen: {base:.2f} s  ({args.files / base:.1f} files/s)")
    print(f"mnify convert:                {conv:.2f} s  ({args.files / conv:.1f} files/s)")
    print(f"ratio convert / baseline:     {conv / base:.2f}  (goal <= 1.5)")


if __name__ == "__main__":
    main()
