"""Lint, run by the converter on what it reads and on what it writes.

On the input, lint's findings of the fixable rules are the report's by-rule count of what the
rewrites fix. On the output, each file is linted as part of the distributed program: an MN301
deadlock the input did not have is an internal error (the driver re-plans once, then refuses the
file); every other hazard still there needs a person, unless the converter answered it in a way
this file's lint cannot see (the model converted where another file builds it, the trainers
distributed at run time, a helper fixed where it is called).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable, Mapping

from mnify.lint.diagnostic import Diagnostic, LintSyntaxError
from mnify.lint.registry import ALL_RULES
from mnify.lint.runner import lint_source, lint_wrapper, parse_project, project_collectives
from mnify.rewrites import loops, trainers
from mnify.rewrites.context import FileContext
from mnify.rewrites.input_lines import input_line
from mnify.rewrites.options import ConvertOptions
from mnify.rewrites.registry import fixable_codes
from mnify.rewrites.report import ReportEntry
from mnify.rewrites.result import FileResult

# rules the converter's output must not newly break (MN301 deadlocks: error; MN302: report)
_DEADLOCK_RULES = ("MN301", "MN302")
_DEFAULT_CODES = frozenset(r.code for r in ALL_RULES if r.default_enabled)
_DISTRIBUTED = re.compile(r"create_communicator|comm\.rank|\bchainermn\b")


def _assumed(options: ConvertOptions) -> str:
    """How lint judges the files of a conversion: parts of a data- or model-parallel program."""
    return "data" if options.data_parallel else "model"


def lint_input(ctx: FileContext) -> None:
    """What ``mnify lint`` finds in the input read as the distributed program it is to become:
    the fixable rules' findings, for the report's by-rule count (the rewrites fix them).

    Lint shares this file's resolved ``MetadataWrapper``, so it costs one more walk, not a
    second name resolution. A lint failure costs a note, never the conversion.
    """
    wanted = [code for code in fixable_codes() if code in _DEFAULT_CODES]
    try:
        found = lint_wrapper(
            ctx.wrapper,
            ctx.path,
            source=ctx.source,
            select=wanted,
            assume=_assumed(ctx.options),
        )
    except Exception as exc:
        ctx.entries.append(
            ReportEntry(ctx.path, 1, "lint", "info", f"lint failed on this file: {exc}")
        )
        return
    ctx.found.extend(
        ReportEntry(ctx.path, d.line, "lint", "info", d.message, d.code) for d in found
    )


def _finding_keys(source: str, findings: list[Diagnostic]) -> Counter[tuple[str, str]]:
    lines = source.splitlines()
    return Counter(
        (d.code, lines[d.line - 1].strip() if 0 < d.line <= len(lines) else "") for d in findings
    )


def lint_output(
    results: Mapping[str, FileResult], options: ConvertOptions
) -> dict[str, Diagnostic]:
    """Lint the converted project, each file as part of the distributed program: MN301 findings
    its input did not have are returned (first per file: an internal error); every other
    hazard left in the output goes to the report as needing a person."""
    done = {p: r for p, r in results.items() if r.output is not None and r.skipped is None}
    if not any(r.changed for r in done.values()):
        return {}
    outputs = {p: r.output for p, r in done.items() if r.output is not None}
    inputs = {p: r.source for p, r in done.items()}
    wrappers = parse_project(outputs)
    external_out = project_collectives(outputs, wrappers)
    distributed_input = any(_DISTRIBUTED.search(text) for text in inputs.values())
    external_in = project_collectives(inputs) if distributed_input else {}
    new: dict[str, Diagnostic] = {}
    mnbn_somewhere = any("create_mnbn_model" in text for text in outputs.values())
    trees = {p: ast.parse(text) for p, text in outputs.items()}
    # lint findings inside helpers whose work the converter did where they are called
    done_at_call = _helpers_converted_at_call_sites(trees.values())
    at_run_time = any(
        _called_name(node) == trainers.FUNCTION for t in trees.values() for node in ast.walk(t)
    )
    for path, result in done.items():
        try:
            if path not in wrappers:
                continue
            after = lint_wrapper(
                wrappers[path],
                path,
                source=outputs[path],
                select=sorted(_DEFAULT_CODES),
                external_collectives=external_out,
                assume=_assumed(options),
            )
            before = (
                lint_source(
                    inputs[path],
                    path,
                    select=list(_DEADLOCK_RULES),
                    external_collectives=external_in,
                )
                if _DISTRIBUTED.search(inputs[path])
                else []
            )
        except LintSyntaxError:
            continue  # the output was compiled already; libcst may still refuse odd syntax
        had = _finding_keys(inputs[path], before)
        lines = outputs[path].splitlines()
        for finding in after:
            key = (finding.code, lines[finding.line - 1].strip() if finding.line else "")
            if finding.code in _DEADLOCK_RULES and had[key] > 0:
                had[key] -= 1
                continue
            if finding.code == "MN301":
                new.setdefault(path, finding)
                continue
            if finding.code == "MN502" and mnbn_somewhere:
                continue  # the model is converted where another file builds it
            if at_run_time and trainers.covered_at_run_time(finding.code, finding.message):
                continue  # mn.distribute_trainers(comm) converts it when its Trainer runs
            if finding.code == "MN501" and _built_everywhere_on_purpose(result, finding):
                continue
            fixed_in = done_at_call.get(finding.code)
            if fixed_in and _enclosing_function(trees[path], finding.line) in fixed_in:
                continue

            result.entries.append(
                ReportEntry(
                    path,
                    input_line(result.source, result.output, finding.line),
                    "lint",
                    "needs-person",
                    finding.message,
                    finding.code,
                )
            )
    return new


def _built_everywhere_on_purpose(result: FileResult, finding: Diagnostic) -> bool:
    """MN501 on arrays a hand-written loop's rewrite scatters while every rank still builds
    them: the report already says so (an info entry), and why."""
    name = finding.message.split("`")[1] if finding.message.count("`") >= 2 else ""
    said = f"{loops.EVERY_RANK_BUILDS}{name} "
    return bool(name) and any(
        e.step == "hand-loop" and e.message.startswith(said) for e in result.entries
    )


def _called_name(node: ast.AST) -> str | None:
    """The last name of the function a call (or a statement that is one) calls."""
    if isinstance(node, (ast.Expr, ast.Assign)):
        node = node.value
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _helpers_converted_at_call_sites(trees: Iterable[ast.Module]) -> dict[str, set[str]]:
    """Lint codes -> names of helpers whose finding the converter fixed where they are called:
    MN503 for ``create_multi_node_optimizer(make_optimizer(model), comm)``; MN401 and MN505 for
    a helper every converted call of which is followed by ``distribute_extensions(trainer,
    comm)``."""
    wrapped: set[str] = set()
    distributed: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                if _called_name(node) == "create_multi_node_optimizer":
                    name = _called_name(node.args[0])
                    if name:
                        wrapped.add(name)
            for part in ("body", "orelse", "finalbody"):
                body = getattr(node, part, None)
                if not isinstance(body, list):
                    continue
                for before, after in zip(body, body[1:], strict=False):
                    if _called_name(after) == "distribute_extensions":
                        name = _called_name(before)
                        if name:
                            distributed.add(name)
    return {
        "MN503": wrapped,
        "MN401": distributed,
        "MN505": distributed,
        "MN402": _methods_called_on_rank0_only(trees),
    }


def _methods_called_on_rank0_only(trees: Iterable[ast.Module]) -> set[str]:
    """Methods every call of which (``obj.name(...)``) stands alone under ``if comm.rank == 0:``:
    their writes are rank 0's (helper_writes guards writing methods where they are called)."""
    guarded: set[str] = set()
    anywhere: Counter[str] = Counter()
    on_rank0: Counter[str] = Counter()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                anywhere[node.func.attr] += 1
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith(".rank == 0"):
                for stmt in node.body:
                    call = stmt.value if isinstance(stmt, ast.Expr) else None
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                        on_rank0[call.func.attr] += 1
                        guarded.add(call.func.attr)
    return {name for name in guarded if on_rank0[name] == anywhere[name]}


def _enclosing_function(tree: ast.Module, line: int) -> str | None:
    """The name of the innermost function around ``line``."""
    best: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end and (best is None or node.lineno >= best.lineno):
                best = node
    return best.name if best is not None else None
