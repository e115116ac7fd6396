"""How long ``mnify convert`` takes against what libcst itself needs for the same files.

Generates 200 Chainer training scripts (variants of the converter fixtures) in a temporary
directory and times, on the same files in the same run:

* baseline: libcst parse + ``QualifiedNameProvider`` resolution + code generation;
* rewrites: the conversion without its checks (parse, one resolution, all rewrites, code
  generation, compile of the output);
* convert: the whole conversion, with the checks that prove the output before anyone may
  write it: the equivalence check against input and plan, the report's claims, and lint over
  the input and the converted project (MN301 deadlocks and the hazards left for a person).

Prints files per second, the ratio rewrites / baseline (goal: at most 1.5) and what the checks
add on their own. The sides are timed file by file, interleaved, ``--repeat`` times; the
fastest total of each counts, since the machine is shared.

    .venv/bin/python bench/convert.py [--files 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from mnify.converter import ConvertOptions, convert_sources, reconcile
from mnify.rewrites import verify

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


@contextlib.contextmanager
def checks_off() -> Iterator[None]:
    """The conversion with its self-checks (and the lint they run) replaced by no-ops."""
    saved = (
        verify.check_output,
        verify.check_claims,
        reconcile.lint_output,
        reconcile.lint_input,
    )
    verify.check_output = lambda *a, **k: None  # type: ignore[assignment]
    verify.check_claims = lambda *a, **k: None  # type: ignore[assignment]
    reconcile.lint_output = lambda *a, **k: {}  # type: ignore[assignment]
    reconcile.lint_input = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        (
            verify.check_output,
            verify.check_claims,
            reconcile.lint_output,
            reconcile.lint_input,
        ) = saved


def measure(paths: list[Path], sources: list[str], repeat: int) -> tuple[float, float, float]:
    """Best-of-``repeat`` totals (baseline, rewrites, whole conversion), the sides interleaved
    file by file. The machine is shared: interleaving makes every side see the same load.
    """
    options = ConvertOptions()
    best = [float("inf")] * 3
    for _ in range(repeat):
        totals = [0.0, 0.0, 0.0]
        for path, source in zip(paths, sources, strict=True):
            gc.collect()  # no side pays for collecting another's garbage
            t0 = time.perf_counter()
            libcst_alone(source)
            totals[0] += time.perf_counter() - t0
            gc.collect()
            with checks_off():
                t0 = time.perf_counter()
                mnify_convert(path, source, options)
                totals[1] += time.perf_counter() - t0
            gc.collect()
            t0 = time.perf_counter()
            mnify_convert(path, source, options)
            totals[2] += time.perf_counter() - t0
        best = [min(b, t) for b, t in zip(best, totals, strict=True)]
    return best[0], best[1], best[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = generate(Path(tmp), args.files)
        sources = [p.read_text(encoding="utf-8") for p in paths]
        lines = sum(s.count("\n") for s in sources)
        base, rewrites, conv = measure(paths, sources, args.repeat)
    print(f"{args.files} scripts, {lines} lines")
    print(f"libcst parse+resolve+codegen: {base:.2f} s  ({args.files / base:.1f} files/s)")
    print(f"mnify rewrites (no checks):   {rewrites:.2f} s  ({args.files / rewrites:.1f} files/s)")
    print(f"mnify convert (with checks):  {conv:.2f} s  ({args.files / conv:.1f} files/s)")
    print(f"ratio rewrites / baseline:    {rewrites / base:.2f}  (goal <= 1.5)")
    print(f"ratio convert / baseline:     {conv / base:.2f}")
    print(f"the checks' own cost:         {(conv - rewrites) / base:.2f} x baseline")


if __name__ == "__main__":
    main()
