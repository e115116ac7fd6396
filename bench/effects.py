"""How long the effect analysis (mnify/program/effects.py) takes on an installed package, cold
and cached, and what it finds: every function and method of the package that writes or trains.

The package is found on ``sys.path`` and read from its source (never imported). Every module of
it is reached through a generated script that calls each of its functions and methods, so this is
the worst case: a conversion reads only the modules its calls reach.

    .venv/bin/python bench/effects.py chainer_chemistry [--show 40]
"""

from __future__ import annotations

import argparse
import ast
import importlib.machinery
import tempfile
import time
from pathlib import Path

from mnify.program.effect_cache import SummaryCache
from mnify.program.effect_summary import MODULE_CODE, summarise
from mnify.program.effects import ProjectEffects


def _modules(package: str) -> list[tuple[str, Path]]:
    spec = importlib.machinery.PathFinder.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package}: not an installed package")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def _caller(package: str) -> str:
    """A script calling every function and method of every module (through its class)."""
    lines = ["def main():"]
    for module, path in _modules(package):
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        summary = summarise(tree, module, path.name == "__init__.py")
        for key in summary["functions"]:
            if key == MODULE_CODE:
                continue
            if "." in key:
                cls, method = key.split(".", 1)
                lines.append(f"    {module}.{cls}.{method}()")
            else:
                lines.append(f"    {module}.{key}()")
    imports = sorted({".".join(line.strip().split("(")[0].split(".")[:-1]) for line in lines[1:]})
    return "\n".join([f"import {m}" for m in imports if m] + lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--show", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "every_call.py")
        script.write_text(_caller(args.package))
        tree = {str(script): ast.parse(script.read_text())}
        cache_dir = Path(tmp, "cache")
        timings = []
        for label in ("cold", "cached"):
            start = time.perf_counter()
            effects = ProjectEffects(tree, cache=SummaryCache(cache_dir))
            found = effects.at_lines(str(script), 1, 10**9)
            per_call = [
                (line.strip()[:-2], effects.at_lines(str(script), number, number))
                for number, line in enumerate(script.read_text().splitlines(), 1)
                if line.strip().endswith("()")
            ]
            timings.append((label, time.perf_counter() - start, effects.cache))
        for label, seconds, cache in timings:
            print(
                f"{label}: {seconds:.2f} s, {len(effects.modules_read)} modules read "
                f"(cache hits {cache.hits}, misses {cache.misses})"
            )
        print(f"the package as a whole: {', '.join(sorted(found))}")
        for kind in ("trains", "writes", "forks", "imports"):
            having = [(call, e[kind]) for call, e in per_call if kind in e]
            print(f"{kind}: {len(having)} functions and methods")
            for call, effect in having[: args.show]:
                print(f"  {call}: {effect.what} at {Path(effect.path).name}:{effect.line}")


if __name__ == "__main__":
    main()
