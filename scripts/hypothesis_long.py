#!/usr/bin/env python
"""Run the converter's property tests with a long budget, outside CI.

Same properties as ``tests/convert/test_properties.py``, from ``testkit/properties.py``
(``check_skeleton`` on generated Chainer scripts, each converted under drawn flags;
``check_arbitrary_program`` on hypothesmith programs), many more examples. The run goes in chunks with different seeds; after each
skeleton chunk some of its scripts are converted in fresh interpreters under other hash seeds
and ``PYTHONMALLOC=malloc`` and compared byte for byte. A failure is filed under a signature
(property + message with line numbers and quoted code masked); once a signature is filed, later
examples failing the same way count as hits of a known failure and the search goes on for new
ones. Every filed failure is written to ``--failures DIR`` as ``NN-<property>.py`` (the minimal
input: hypothesis's shrunk draw, unless ``--no-shrink``, then reduced statement by statement),
``NN-<property>.drawn.py`` (as drawn) and ``NN-<property>.txt`` (what failed, with which
flags). ``--reduce FILE [--property P]`` reduces one failing script and prints it.

    nice -n 19 timeout 6h .venv/bin/python scripts/hypothesis_long.py --examples 50000 --no-shrink

(``--no-shrink``: statement-level reduction gives smaller examples than shrinking the draws,
in a fraction of the time.)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import keyword
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import hypothesmith  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mnify.rewrites import ConvertOptions  # noqa: E402
from testkit.properties import (  # noqa: E402
    CROSS_PROCESS_ENVS,
    PropertyFailure,
    check_arbitrary_program,
    check_skeleton,
    convert_in_subprocesses,
    skeleton_checks,
)
from testkit.skeletons import Skeleton, skeletons  # noqa: E402


def _mask_quoted(match: re.Match[str]) -> str:
    """Quoted code varies; quoted rule codes (``'MN302'``) tell failures apart and stay."""
    return match.group(0) if re.fullmatch(r"MN\d{3}", match.group(1)) else "'…'"


def _shape(line: str) -> str:
    """A changed line of a diff without the user's names: its sign, keywords and the last part
    of dotted names (``+ = scatter_dataset True`` for any dataset and runtime spelling)."""
    words = []
    for word in re.findall(r"[A-Za-z_][\w.]*", line):
        if "." in word:
            words.append(word.rsplit(".", 1)[1])
        elif keyword.iskeyword(word):
            words.append(word)
    return " ".join([line[0], *(["="] if " = " in line else []), *words])


def signature(prop: str, detail: str) -> str:
    """The failure with what varies between examples masked (lines, quoted code, names). Of a
    diff in the message only the shape of the changed lines counts (see ``_shape``)."""
    first, *rest = detail.splitlines() or [""]
    changed = [
        _shape(line) for line in rest if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    text = " | ".join([first, *changed])
    text = re.sub(r"`[^`]*`", "`…`", text)
    text = re.sub(r"'([^']*)'", _mask_quoted, text)
    text = re.sub(r"\b\d+\b", "N", text)
    text = re.sub(r"(\('MN\d+', '…'\))(, \1)+", r"\1", text)  # how often does not matter
    return f"{prop}: {text[:300]}"


@dataclass
class Failure:
    prop: str
    detail: str
    source: str  # as hypothesis shrank it
    options: ConvertOptions = field(default_factory=ConvertOptions)
    hits: int = 1
    reduced: str | None = None  # after reduce_source


# The conversion flags each skeleton is converted with (the defaults most often): the
# properties hold whatever the user asks for.
OPTION_SETS = (
    *[ConvertOptions()] * 4,
    ConvertOptions(target="chainermn"),
    ConvertOptions(scaling="strong"),
    ConvertOptions(communicator="pure_nccl"),
    ConvertOptions(scale_lr="linear"),
    ConvertOptions(model_parallel="channel"),
)


def describe(options: ConvertOptions) -> str:
    """The flags that differ from the defaults, as a short label."""
    default = ConvertOptions()
    changed = [
        f"{f.name}={getattr(options, f.name)}"
        for f in dataclasses.fields(options)
        if getattr(options, f.name) != getattr(default, f.name)
    ]
    return ", ".join(changed) or "defaults"


def failure_signature(
    source: str, arbitrary: bool, only: str | None = None, options: ConvertOptions | None = None
) -> str | None:
    """The signature ``source`` fails with under the properties (or ``converts`` and
    ``only``), or None when it passes."""
    try:
        if arbitrary:
            try:
                check_arbitrary_program(source)
            except Exception as exc:
                raise PropertyFailure("arbitrary-program", f"{type(exc).__name__}: {exc}") from exc
        else:
            check_skeleton(source, only, options or ConvertOptions())
    except PropertyFailure as failure:
        return signature(failure.prop, failure.detail)
    return None


@dataclass
class Run:
    """State shared by the chunks: counts, filed failures, the chunk's target signature."""

    tried: int = 0
    hits: int = 0
    filed: dict[str, Failure] = field(default_factory=dict)
    target: str | None = None  # the new signature this chunk is shrinking
    pending: set[str] = field(default_factory=set)  # new signatures seen while shrinking another
    last: Failure | None = None
    drawn: list[str] = field(default_factory=list)  # this chunk's scripts

    def judge(
        self, prop: str, detail: str, source: str, options: ConvertOptions | None = None
    ) -> None:
        """Raise for the signature this chunk hunts; count everything else and pass."""
        sig = signature(prop, detail)
        if sig in self.filed:
            self.filed[sig].hits += 1
            self.hits += 1
            return
        if self.target is None:
            self.target = sig
        if sig != self.target:
            self.pending.add(sig)
            return
        self.last = Failure(prop, detail, source, options or ConvertOptions())
        raise PropertyFailure(prop, detail)


def run_chunk(
    run: Run, examples: int, chunk_seed: int, arbitrary: bool, shrink: bool, reduce: bool
) -> None:
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    config = settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )

    if arbitrary:

        @seed(chunk_seed)
        @config
        @given(hypothesmith.from_grammar())
        def test(source: str) -> None:
            run.tried += 1
            try:
                check_arbitrary_program(source)
            except Exception as exc:
                run.judge("arbitrary-program", f"{type(exc).__name__}: {exc}", source)

    else:

        @seed(chunk_seed)
        @config
        @given(skeletons(), st.sampled_from(OPTION_SETS))
        def test(skeleton: Skeleton, options: ConvertOptions) -> None:
            run.tried += 1
            run.drawn.append(skeleton.source)
            try:
                check_skeleton(skeleton.source, options=options)
            except PropertyFailure as failure:
                run.judge(failure.prop, failure.detail, skeleton.source, options)

    run.target, run.last, run.drawn = None, None, []
    try:
        test()
    except PropertyFailure:
        # hypothesis replays the minimal example last, so run.last is the shrunk one
        assert run.target is not None and run.last is not None
        run.filed[run.target] = run.last
        if reduce:
            target = run.target
            options = run.last.options
            run.last.reduced = reduce_source(
                run.last.source,
                lambda text: failure_signature(text, arbitrary, None, options) == target,
            )


def _blocks(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Every statement list in ``tree``, as (owner, field)."""
    found = []
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                found.append((node, name))
    return found


def _variants(source: str) -> list[str]:
    """Smaller programs: one statement dropped, or a compound statement replaced by its body."""
    out = []
    tree = ast.parse(source)
    for b, (owner, name) in enumerate(_blocks(tree)):
        for i in range(len(getattr(owner, name))):
            for unwrap in (False, True):
                copy = ast.parse(source)
                block_owner, block_name = _blocks(copy)[b]
                body = getattr(block_owner, block_name)
                stmt = body[i]
                if unwrap:
                    inner = getattr(stmt, "body", None)
                    if not isinstance(inner, list) or isinstance(stmt, ast.FunctionDef):
                        continue
                    body[i : i + 1] = inner
                else:
                    del body[i]
                if not body:
                    body.append(ast.Pass())
                out.append(ast.unparse(copy) + "\n")
    return out


def _names_defined(source: str) -> bool:
    """No undefined names (ruff's F821), so a reduced example is still a sensible program.
    Without ruff on PATH or beside this interpreter every candidate counts as sensible."""
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        return True
    check = subprocess.run(
        [ruff, "check", "--isolated", "--select", "F821", "--stdin-filename", "x.py", "-"],
        input=source,
        capture_output=True,
        text=True,
    )
    return check.returncode == 0


def reduce_source(source: str, still_fails: Callable[[str], bool], budget: int = 2000) -> str:
    """Greedy statement-level delta debugging: the smallest program that still fails the
    same way (hypothesis shrinks the draws; this also drops the scaffold the grammar always
    writes)."""
    current = source
    tries = 0
    progress = True
    while progress and tries < budget:
        progress = False
        for candidate in _variants(current):
            tries += 1
            if (
                len(candidate) < len(current)
                and _names_defined(candidate)
                and still_fails(candidate)
            ):
                current = candidate
                progress = True
                break
            if tries >= budget:
                break
    return current


def cross_process_check(run: Run, count: int) -> None:
    """Convert ``count`` of this chunk's scripts under each hash seed and allocator in fresh
    interpreters; a script whose bytes differ is filed (as the scripts themselves)."""
    sample = list(dict.fromkeys(run.drawn))[:count]
    if not sample:
        return
    with tempfile.TemporaryDirectory() as folder:
        results = convert_in_subprocesses(sample, Path(folder), CROSS_PROCESS_ENVS)
    baseline = results.pop("hashseed-0")
    for label, outputs in results.items():
        for source, got, want in zip(sample, outputs, baseline, strict=True):
            if got == want:
                continue
            sig = f"cross-process: {label} differs from hashseed-0"
            if sig in run.filed:
                run.filed[sig].hits += 1
                run.hits += 1
            else:
                run.filed[sig] = Failure("cross-process", sig, source)


def write_failures(run: Run, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    summary = []
    for n, (sig, failure) in enumerate(run.filed.items(), 1):
        stem = f"{n:02d}-{failure.prop}"
        (folder / f"{stem}.py").write_text(failure.reduced or failure.source, encoding="utf-8")
        if failure.reduced is not None:
            (folder / f"{stem}.drawn.py").write_text(failure.source, encoding="utf-8")
        (folder / f"{stem}.txt").write_text(
            f"property: {failure.prop}\nsignature: {sig}\nhits: {failure.hits}\n"
            f"options: {describe(failure.options)}\n\n{failure.detail}\n",
            encoding="utf-8",
        )
        summary.append(
            {
                "file": f"{stem}.py",
                "signature": sig,
                "hits": failure.hits,
                "options": describe(failure.options),
            }
        )
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=50_000, help="examples in all")
    parser.add_argument("--chunk", type=int, default=200, help="examples per seeded chunk")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first chunk")
    parser.add_argument(
        "--arbitrary-share",
        type=float,
        default=0.1,
        help="share of chunks drawing hypothesmith programs instead of Chainer skeletons",
    )
    parser.add_argument("--failures", type=Path, default=Path("hypothesis-failures"))
    parser.add_argument(
        "--cross-process",
        type=int,
        default=10,
        metavar="N",
        help="after each chunk convert N of its scripts under other hash seeds and malloc",
    )
    parser.add_argument("--no-shrink", action="store_true", help="file failures as drawn")
    parser.add_argument(
        "--no-reduce", action="store_true", help="skip statement-level reduction of failures"
    )
    parser.add_argument(
        "--reduce",
        type=Path,
        metavar="FILE",
        help="only reduce FILE (a failing script) to a minimal one, print it and exit",
    )
    parser.add_argument(
        "--property",
        choices=sorted(skeleton_checks("")),
        help="with --reduce: reduce the failure of this property (default: the first failing)",
    )
    options = parser.parse_args(argv)

    if options.reduce is not None:
        text = options.reduce.read_text(encoding="utf-8")
        only = options.property
        target = failure_signature(text, False, only)
        if target is None:
            print(f"{options.reduce} passes {only or 'every property'}")
            return 0
        print(f"# {target}")
        print(reduce_source(text, lambda t: failure_signature(t, False, only) == target), end="")
        return 1

    run = Run()
    start = time.monotonic()
    chunk = 0
    every = max(1, round(1 / options.arbitrary_share)) if options.arbitrary_share > 0 else 0
    while run.tried < options.examples:
        arbitrary = every > 0 and chunk % every == every - 1
        size = min(options.chunk, options.examples - run.tried)
        before = len(run.filed)
        run_chunk(
            run, size, options.seed + chunk, arbitrary, not options.no_shrink, not options.no_reduce
        )
        if not arbitrary and options.cross_process > 0:
            cross_process_check(run, options.cross_process)
        chunk += 1
        write_failures(run, options.failures)
        new = len(run.filed) - before
        print(
            f"chunk {chunk} ({'hypothesmith' if arbitrary else 'skeletons'}): "
            f"{run.tried} examples tried, {len(run.filed)} failures filed"
            f"{f' (+{new})' if new else ''}, {run.hits} hits of filed failures, "
            f"{len(run.pending - run.filed.keys())} seen but not yet shrunk, {time.monotonic() - start:.0f}s",
            flush=True,
        )
    print(
        f"done: {run.tried} examples tried, {len(run.filed)} distinct failures "
        f"({run.hits} further hits), {time.monotonic() - start:.0f}s; "
        f"minimal examples in {options.failures}/"
    )
    for sig, failure in run.filed.items():
        print(f"  [{failure.hits} hits] {sig}")
    return 1 if run.filed else 0


if __name__ == "__main__":
    sys.exit(main())
