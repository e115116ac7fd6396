"""Converting files: parse, resolve names once, plan every rewrite, apply, check, diff.

Several files convert together as one project: a model class in ``net.py`` that holds
BatchNormalization is converted where ``train.py`` builds it (``call_sites``), and the
deadlock check follows calls from file to file. Every output is checked against its input and
plan (``verify``) and must parse before anyone may write it; a file that fails gets an error
and is left untouched.
"""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper

from mnify import vocabulary as vocab
from mnify.lint.diagnostic import Diagnostic, LintSyntaxError
from mnify.lint.noqa import parse_suppressions
from mnify.lint.registry import ALL_RULES
from mnify.lint.runner import lint_source, lint_wrapper, parse_project, project_collectives
from mnify.rewrites import (
    call_sites,
    communicator,
    distributed,
    evaluator,
    imports,
    loops,
    trainers,
)
from mnify.rewrites.context import FileContext
from mnify.rewrites.edits import ApplyEdits, EditPlan
from mnify.rewrites.facts import FactCollector
from mnify.rewrites.options import ConvertOptions
from mnify.rewrites.registry import fixable_codes, load_rewrites
from mnify.rewrites.report import ReportEntry
from mnify.rewrites.verify import PlanRecords, VerificationError, check_output, kind_name

# rules the converter's output must not newly break (MN301 deadlocks: error; MN302: report)
_DEADLOCK_RULES = ("MN301", "MN302")
_DEFAULT_CODES = frozenset(r.code for r in ALL_RULES if r.default_enabled)
_DISTRIBUTED = re.compile(r"create_communicator|comm\.rank|\bchainermn\b")


@dataclass
class FileResult:
    """One file's conversion: the new text (None on error/skip) and its report entries."""

    path: str
    source: str
    output: str | None = None
    error: str | None = None
    skipped: str | None = None
    entries: list[ReportEntry] = field(default_factory=list)
    # what lint found in the input read as a distributed program (fixable rules)
    found: list[ReportEntry] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.output is not None and self.output != self.source

    def diff(self) -> str:
        if not self.changed:
            return ""
        assert self.output is not None
        return "".join(
            difflib.unified_diff(
                self.source.splitlines(keepends=True),
                self.output.splitlines(keepends=True),
                fromfile=f"a/{self.path}",
                tofile=f"b/{self.path}",
            )
        )


def parse_error(exc: Exception, source: str, path: str) -> str:
    """``LINE:COL: reason`` for a file that does not parse: where CPython's ``compile()`` says
    (what the user sees when running it), else libcst's position (1-based column)."""
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as syntax:
        return f"{syntax.lineno or 1}:{syntax.offset or 1}: {syntax.msg}"
    except ValueError as bad:  # null bytes
        return f"1:1: {bad}"
    if isinstance(exc, cst.ParserSyntaxError):
        reason = exc.message.strip().splitlines()[0] if exc.message else "invalid syntax"
        return f"{exc.raw_line}:{exc.raw_column + 1}: {reason}"
    return f"1:1: {exc}"


def module_name(path: str) -> str:
    return Path(path).stem


def _peek_bn_factory(paths: list[str], converted: set[str]) -> Callable[[str], bool]:
    """Whether a class imported from a sibling module that is NOT converted uses BN."""
    cache: dict[Path, bool] = {}

    def peek(qname: str) -> bool:
        parts = qname.lstrip(".").split(".")
        if len(parts) < 2 or parts[-2] in converted:
            return False
        for p in paths:
            candidate = Path(p).parent / (parts[-2] + ".py")
            if candidate not in cache:
                try:
                    text = candidate.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    text = ""
                cls = re.search(rf"^class\s+{re.escape(parts[-1])}\b", text, re.M)
                cache[candidate] = bool(cls) and "BatchNormalization" in text
            if cache[candidate]:
                return True
        return False

    return peek


def _assumed(options: ConvertOptions) -> str:
    """How lint judges the files of a conversion: parts of a data- or model-parallel program."""
    return "data" if options.data_parallel else "model"


def _lint_input(ctx: FileContext) -> None:
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


def convert_sources(
    sources: Mapping[str, str],
    options: ConvertOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[FileResult]:
    """Convert ``{path: source}`` together; results in the same order.

    ``progress(path)`` is called as each file is finished (for a progress bar). The outputs
    pass the deadlock rule MN301 as a project (calls into other converted files count): when the
    first conversion puts a call that now reaches a collective under a rank guard, the project
    is planned again with those calls kept on every rank; a finding that still remains is an
    internal error for its file, which then gets no output.
    """
    options = options or ConvertOptions()
    results = _convert_project(sources, options, progress, frozenset())
    new = _new_collective_findings(results, options)
    if new:
        outputs = {p: r.output for p, r in results.items() if r.output is not None}
        callees = frozenset(project_collectives(outputs))
        results = _convert_project(sources, options, None, callees)
        new = _new_collective_findings(results, options)
    for path, finding in new.items():
        result = results[path]
        result.error = f"internal: {finding.line}: {finding.message} (MN301, not in the input)"
        result.output = None
    return [results[p] for p in sources]


def _finding_keys(source: str, findings: list[Diagnostic]) -> Counter[tuple[str, str]]:
    lines = source.splitlines()
    return Counter(
        (d.code, lines[d.line - 1].strip() if 0 < d.line <= len(lines) else "") for d in findings
    )


def _new_collective_findings(
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
                    _input_line(result, finding.line),
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


def _input_line(result: FileResult, output_line: int) -> int:
    """The input line an output line came from (the nearest unchanged line above it)."""
    if result.output is None or result.output == result.source:
        return output_line
    matcher = difflib.SequenceMatcher(
        None, result.source.splitlines(), result.output.splitlines(), autojunk=False
    )
    best = 1
    for a, b, size in matcher.get_matching_blocks():
        if b <= output_line - 1 < b + size:
            return a + (output_line - 1 - b) + 1
        if b + size <= output_line - 1:
            best = a + size
    return best


def _convert_project(
    sources: Mapping[str, str],
    options: ConvertOptions,
    progress: Callable[[str], None] | None,
    collective_callees: frozenset[str],
) -> dict[str, FileResult]:
    """One planning and applying pass over the project (see :func:`convert_sources`)."""
    results: dict[str, FileResult] = {}
    contexts: dict[str, FileContext] = {}
    for path, source in sources.items():
        result = results[path] = FileResult(path, source)
        if parse_suppressions(source).whole_file:
            result.skipped = "# mnify: noqa"
            continue
        try:
            module = cst.parse_module(source)
        except Exception as exc:  # libcst raises ParserSyntaxError, but be safe on odd input
            result.error = parse_error(exc, source, path)
            continue
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        collector = FactCollector()
        wrapper.visit(collector)
        ctx = FileContext(
            path, module_name(path), source, wrapper, module, collector.facts, options
        )
        ctx.collective_callees = collective_callees
        why = distributed.reason(ctx) if options.leave_distributed else None
        if why is not None:
            result.skipped = f"already distributed ({why})"
            result.output = source
            result.entries.append(
                ReportEntry(path, 1, "distributed", "info", f"left unchanged: {why}")
            )
            continue
        contexts[path] = ctx
    converted = {ctx.module_name for ctx in contexts.values()}
    peek = _peek_bn_factory(list(sources), converted)
    for ctx in contexts.values():
        ctx.external_bn = peek
    found: dict[str, bool] = {}
    for _ in range(3):  # a subclass in one file of an evaluator in another
        for ctx in contexts.values():
            ctx.project_evaluators = dict(found)
        grown: dict[str, bool] = {}
        for ctx in contexts.values():
            grown.update(evaluator.project_evaluators(ctx))
        if grown == found:
            break
        found = grown
    for ctx in contexts.values():
        ctx.project_evaluators = found
    for path, ctx in list(contexts.items()):
        try:
            _plan_file(ctx)
        except Exception as exc:  # a rewrite bug costs this file, not the whole run
            results[path].error = f"internal: 1: error while planning: {exc!r}"
            del contexts[path]
    call_sites.plan_project(contexts)
    loops.plan_project(contexts)
    _leave_alone_if_nothing_is_parallel(contexts)
    _leave_alone_scripts_that_do_not_train(contexts)
    for path in sources:
        if path not in contexts and progress is not None:
            progress(path)
    for path, ctx in contexts.items():
        if progress is not None:
            progress(path)
        result = results[path]
        try:
            _finish_file(ctx, result)
        except Exception as exc:
            result.error = f"internal: 1: error while converting: {exc!r}"
    return results


def _reset(ctx: FileContext) -> None:
    """Forget every planned edit of a file (it is left as it is)."""
    ctx.plan = EditPlan(comm=ctx.plan.comm)
    ctx.comm_needed = False
    ctx.imports_needed.clear()
    ctx.preamble = []
    ctx.claims = []


def _leave_alone_scripts_that_do_not_train(contexts: Mapping[str, FileContext]) -> None:
    """A script of the converted tree that trains nothing (data preparation, prediction,
    evaluation of a saved model) is no part of the distributed job: it gets no communicator
    and stays as it is, instead of needing MPI or evaluating one shard."""
    for ctx in contexts.values():
        entry = ctx.entry
        if entry is None or entry.exists or not ctx.comm_needed or ctx.distribute_trainers:
            continue
        if not ctx.options.data_parallel or ctx.options.only_codes is not None:
            continue
        trains = any(
            vocab.is_optimizer(c.qname) or vocab.is_trainer(c.qname) or c.method == "update"
            for c in ctx.facts.calls
        ) or any(e.step == "optimizer" and e.severity == "changed" for e in ctx.entries)
        if trains:
            continue
        _reset(ctx)
        ctx.entries = [e for e in ctx.entries if e.severity == "needs-person"]
        ctx.entries.append(
            ReportEntry(
                ctx.path,
                1,
                "communicator",
                "info",
                "this script trains nothing (no optimizer, trainer or update): it is no part of "
                "the distributed job and is left as it is",
                "MN801",
            )
        )


def _leave_alone_if_nothing_is_parallel(contexts: Mapping[str, FileContext]) -> None:
    """Issue 12, pattern 7: when training happens where the communicator cannot reach (inside a
    library helper, or in code outside the converted files), no optimizer becomes multi-node and
    a converted script would only look parallel. Then nothing is changed and the report says
    plainly why and what to do."""
    if not contexts or not all(
        ctx.options.data_parallel and ctx.options.only_codes is None for ctx in contexts.values()
    ):
        return
    entries = [e for ctx in contexts.values() for e in ctx.entries]
    if any(e.step == "optimizer" and e.severity == "changed" for e in entries):
        return
    stranded = [e for e in entries if e.step == "optimizer" and e.severity == "needs-person"]
    built = [
        (ctx, c)
        for ctx in contexts.values()
        for c in ctx.facts.calls
        if vocab.is_optimizer(c.qname) and not vocab.is_multi_node_optimizer_factory(c.parent_qname)
    ]
    if any(ctx.suppressed(c.node, "optimizer") for ctx, c in built):
        return  # the user kept the optimizer as it is on purpose
    iterators = any(
        vocab.is_iterator(c.qname) for ctx in contexts.values() for c in ctx.facts.calls
    )
    loads = any(
        vocab.is_dataset_factory(c.qname) for ctx in contexts.values() for c in ctx.facts.calls
    )
    # an entry point that builds a model and calls a training function it does not define
    # (``run_train(model, ...)`` of a library) hands its model to training elsewhere
    models = any(
        vocab.is_link_name(c.qname) and c.cls is None
        for ctx in contexts.values()
        if ctx.entry is not None
        for c in ctx.facts.calls
    ) and any(trainers.calls_training_elsewhere(ctx) for ctx in contexts.values())
    if not stranded and not built and (iterators or not (loads or models)):
        return  # no training at all here (a model or data module on its own)
    if stranded:
        where = (
            f"the optimizer is built at {stranded[0].path}:{stranded[0].line}, where the "
            "communicator is not in scope"
        )
    elif built:
        ctx0, call0 = built[0]
        where = (
            f"the optimizer is built at {ctx0.path}:{ctx0.line(call0.node)} inside training "
            "code the entry point calls, which does not hand it back (a library-style helper)"
        )
    else:
        where = (
            "no optimizer is built in the converted files: training happens in code that was "
            "not converted (a library helper)"
        )
    trains_with_a_trainer = any(
        vocab.is_trainer(c.qname) for ctx in contexts.values() for c in ctx.facts.calls
    )
    hosts = trainers.hosts(contexts)
    mnify_target = all(ctx.options.target == "mnify" for ctx in contexts.values())
    # a project converted before (its communicator exists) is left as it is, as below
    fresh = not any(ctx.entry is not None and ctx.entry.exists for ctx in contexts.values())
    if mnify_target and fresh and hosts and (trains_with_a_trainer or not (stranded or built)):
        _distribute_at_run_time(contexts, hosts, where, outside=not (stranded or built))
        return
    for ctx in contexts.values():
        _reset(ctx)
        ctx.entries = [e for e in ctx.entries if e.severity == "needs-person"]
    first = next(iter(contexts.values()))
    first.entries.append(
        ReportEntry(
            first.path,
            1,
            "optimizer",
            "needs-person",
            f"nothing was parallelised: {where}. Pass a communicator into the code that trains "
            "(create it where the script starts, hand it down) and wrap its optimizer with "
            "create_multi_node_optimizer and its datasets with scatter_dataset there, or convert "
            "that code too; a script that only looked converted would train N identical copies"
            + (
                ""
                if mnify_target
                else " (ChainerMN has no run-time distribution of trainers; with --target "
                "mnify the converter adds mn.distribute_trainers(comm) when that code runs a "
                "chainer Trainer)"
            ),
            "MN503",
        )
    )


# needs-person entries that run-time distribution answers (the optimizer, datasets and
# evaluators of the unreachable training code)
_COVERED_AT_RUN_TIME = frozenset({"optimizer", "dataset", "evaluator"})


def _distribute_at_run_time(
    contexts: Mapping[str, FileContext], hosts: list[FileContext], where: str, outside: bool
) -> None:
    """The fallback when the training runs a Trainer the converter cannot reach: everything
    planned stays (rank guards, the communicator), each host gets
    ``mn.distribute_trainers(comm)`` after its communicator, and the helpers' first-use caches
    are built by rank 0 (``rewrites.trainers``)."""
    host_ids = {id(ctx) for ctx in hosts}
    for ctx in contexts.values():
        ctx.entries = [
            e
            for e in ctx.entries
            if not (e.severity == "needs-person" and e.step in _COVERED_AT_RUN_TIME)
        ]
    quiet: set[str] = set()
    if not outside:
        for ctx in contexts.values():
            entry_func = ctx.entry.func if ctx.entry is not None else None
            quiet |= trainers.plan_helpers(
                contexts, ctx, entry_func if id(ctx) in host_ids else None
            )
    for ctx in contexts.values():
        trainers.drop_answered_print_notes(ctx, quiet)
    for ctx in hosts:
        trainers.plan_host(ctx, where)
        if outside:
            trainers.report_unreachable_caches(ctx)


def _plan_file(ctx: FileContext) -> None:
    """Every registered rewrite plans its edits, in the registry's order (the dataset's
    loading guards before the print guards; the forkserver after everything that needs comm)."""
    _lint_input(ctx)
    only = ctx.options.only_codes
    for step in load_rewrites():
        if only is not None and step.step != "communicator" and not (step.codes & only):
            continue
        step.plan(ctx)
        if step.step == "communicator" and ctx.entry is not None:
            ctx.plan.comm = ctx.entry.comm


def _finish_file(ctx: FileContext, result: FileResult) -> None:
    """Insert the communicator and imports, apply the plan, and check the output: it parses,
    and it differs from the input only as the plan says (``verify``)."""
    communicator.emit(ctx, ctx.preamble)
    communicator.emit_helper_fetches(ctx)
    imports.emit(ctx)
    result.entries = ctx.entries
    result.found = ctx.found
    if not ctx.plan:
        result.output = ctx.source
        return
    new = ctx.module.visit(ApplyEdits(ctx.plan, ctx.facts.parent_statement)).code
    try:
        # Python's own parser re-reads the output: what it rejects is never handed out.
        compile(new, ctx.path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        try:
            compile(ctx.source, ctx.path, "exec", dont_inherit=True)
        except SyntaxError as original:  # the input was never valid Python 3 to begin with
            result.error = f"{original.lineno or 1}:{original.offset or 1}: {original.msg}"
            return
        result.error = (
            f"internal: {exc.lineno or 1}:{exc.offset or 1}: output does not parse: {exc.msg}"
        )
        return
    try:
        check_output(ctx.source, new, plan_records(ctx))
        check_claims(ctx, new)
    except VerificationError as bad:
        result.error = f"internal: {bad.line}: {bad.message}"
        return
    result.output = new


def _signature(stmt: ast.stmt) -> str:
    """What identifies a statement across planned expression replacements: the callee of an
    expression statement, the targets of an assignment, a compound statement's own line."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return "call " + ast.unparse(stmt.value.func)
    if isinstance(stmt, ast.Assign):
        return "assign " + " ".join(ast.unparse(t) for t in stmt.targets)
    if isinstance(stmt, (ast.If, ast.While)):
        return f"{type(stmt).__name__} {ast.unparse(stmt.test)}"
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return "with " + ", ".join(ast.unparse(i.context_expr) for i in stmt.items)
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return f"for {ast.unparse(stmt.target)} in {ast.unparse(stmt.iter)}"
    return ast.unparse(stmt)


def check_claims(ctx: FileContext, output: str) -> None:
    """Issue 12, pattern 11: every "on rank 0", "rank 0 loads" and "scatter" entry of the report
    is checked against the produced code; one it does not bear out is an internal error."""
    if not ctx.claims:
        return
    tree = ast.parse(output)
    test = ast.dump(ast.parse(f"{ctx.plan.comm}.rank == 0", mode="eval").body)
    guarded: set[str] = set()
    loads: set[str] = set()
    scattered: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.dump(node.test) == test:
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, ast.stmt):
                        guarded.add(_signature(sub))
            for other in node.orelse:
                if isinstance(other, ast.Assign) and isinstance(
                    other.value, (ast.Constant, ast.Tuple)
                ):
                    for target in other.targets:
                        loads.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "scatter_dataset":
                scattered.add(node.args[0].id)
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            size = node.args[0]
            if (
                name == "scatter_index"
                and isinstance(size, ast.Call)
                and size.args
                and isinstance(size.args[0], ast.Name)
            ):
                scattered.add(size.args[0].id)
    for entry, (kind, subject) in ctx.claims:
        if kind == "guarded":
            assert isinstance(subject, cst.CSTNode)
            original = ast.parse(textwrap.dedent(ctx.code(subject))).body
            ok = bool(original) and _signature(original[0]) in guarded
        elif kind == "rank0-loads":
            ok = subject in loads
        else:
            ok = subject in scattered
        if not ok:
            raise VerificationError(
                entry.line, f"the report says '{entry.message}', but the output does not show it"
            )


def _statement_key(ctx: FileContext, node: cst.CSTNode) -> tuple[int, str]:
    """The (line, kind) by which the output check knows an original statement."""
    first = node.body[0] if isinstance(node, cst.SimpleStatementLine) and node.body else node
    return ctx.line(node), kind_name(type(first).__name__)


def plan_records(ctx: FileContext) -> PlanRecords:
    """The plan as the output check reads it: lines, kinds and code, no nodes."""
    plan = ctx.plan
    records = PlanRecords(guard_test=f"{plan.comm}.rank == 0")
    for key, guard in plan.guard.items():
        records.guarded[_statement_key(ctx, plan.nodes[key])] = guard.else_names
    for within in plan.replaced_within.values():
        if within is not None:
            records.replaced.add(_statement_key(ctx, within))
    empty = cst.Module(body=[])
    for inserted in (*plan.before.values(), *plan.after.values()):
        records.inserted.extend(empty.code_for_node(stmt) for stmt in inserted)
    return records


def convert_source(
    source: str, path: str = "<string>", options: ConvertOptions | None = None
) -> FileResult:
    """Convert one file on its own."""
    return convert_sources({path: source}, options)[0]
