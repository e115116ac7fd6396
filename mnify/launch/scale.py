"""``mnify scale``: run a script at several rank counts, measure, and name what costs the speed-up.

Each count runs the unmodified script under the launcher of ``mnify run`` with the timeline on
and ``scale_updates=W+K+1`` in ``MNIFY_LAUNCH``: :mod:`mnify.runtime.scale_probe` records
updates, iterators, extensions and rank-0-guarded blocks, and stops every rank after update
W+K+1 (so that K whole steps follow the W warm-up ones). The merged timeline is accounted for by
:mod:`mnify.launch.attribution` (the account ``mnify run --timeline`` gives too) and
:mod:`mnify.launch.stragglers`; the causes are judged at the largest count.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mnify import environment
from mnify.launch import attribution, batch_phases, stragglers, timeline_merge
from mnify.launch.attribution import PARTS, Attribution, Breakdown

SCHEMA = 1
CAUSE_SHARE = 0.15  # a cause is named when it costs at least this share of the step
SMALL_BATCH = 32  # per-rank examples under which a GPU is not kept busy


class ScaleError(Exception):
    """A run that could not be measured (it failed, or made too few updates)."""


@dataclass
class Run:
    """One rank count, measured."""

    ranks: int
    update_ms: float  # median time per update
    update_ms_spread: float  # interquartile range of it
    examples_per_update: float | None  # every rank's batch together; None: unknown
    attribution: Attribution
    load: tuple[float, float, float]  # os.getloadavg() after the run
    stragglers: list[stragglers.RankLateness] = field(default_factory=list)
    # mnify run --verify's same-data finding at this count: the ranks it names; None: not run
    same_data: list[int] | None = None
    same_data_note: str = ""  # why it could not be checked
    batch_known: bool = True
    # the global batch of the measured steps, with a global-batch iterator (else empty)
    batch_phases: list[batch_phases.BatchPhase] = field(default_factory=list)

    @property
    def examples_per_s(self) -> float:
        per_update = self.examples_per_update or float(self.ranks)
        return per_update / (self.update_ms / 1e3) if self.update_ms > 0 else 0.0

    @property
    def breakdown(self) -> Breakdown:
        return self.attribution.mean


@dataclass
class Cause:
    kind: str
    ranks: list[int]
    share: float
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ranks": self.ranks,
            "share": round(self.share, 4),
            "message": self.message,
        }


def spread(values: Sequence[float]) -> float:
    """The interquartile range (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def measure_trace(trace: dict[str, Any], ranks: int, warmup: int, updates: int, load: Any) -> Run:
    """The measurement of one run's merged timeline: steps W+1 .. W+K."""
    found = attribution.attribute(trace, first=warmup + 1, last=warmup + updates)
    if not found.steps:
        raise ScaleError(
            f"{ranks} rank(s): no whole update after the {warmup} warm-up ones was recorded "
            "(does the script use mnify.runtime's multi-node optimizer, and run long enough?)"
        )
    # collectives of update k carry the optimizer's step count k - 1
    steps = range(warmup, warmup + updates)
    report = stragglers.analyze(trace, steps=steps, min_steps=max(3, len(found.steps) // 2))
    return Run(
        ranks=ranks,
        update_ms=statistics.median(found.step_ms),
        update_ms_spread=spread(found.step_ms),
        examples_per_update=found.examples_per_step,
        attribution=found,
        load=tuple(load),  # type: ignore[arg-type]
        stragglers=report.stragglers,
        batch_known=found.examples_per_step is not None,
        batch_phases=measured_phases(trace, warmup, updates),
    )


def measured_phases(
    trace: dict[str, Any], warmup: int, updates: int
) -> list[batch_phases.BatchPhase]:
    """The global batch of the measured steps (``warmup`` .. ``warmup + updates - 1``)."""
    first, last = warmup, warmup + updates - 1
    return [
        dataclasses.replace(
            p, first_step=max(p.first_step, first), last_step=min(p.last_step, last)
        )
        for p in batch_phases.phases(trace)
        if p.last_step >= first and p.first_step <= last
    ]


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def causes(runs: Sequence[Run]) -> list[Cause]:
    """What costs the speed-up, judged at the largest count (see docs/scale.md)."""
    if not runs:
        return []
    run = max(runs, key=lambda r: r.ranks)
    step = run.update_ms or 1.0
    found: list[Cause] = []
    per_rank = run.attribution.per_rank
    mean = run.breakdown
    if run.same_data:
        found.append(
            Cause(
                "not-split",
                run.same_data,
                (run.ranks - 1) / run.ranks,
                "mnify run --verify's same-data: the ranks train on the same examples, so "
                "each epoch does the whole work on every rank and no speed-up per epoch is "
                "possible; split the dataset with mnify.runtime.scatter_dataset(dataset, comm)",
            )
        )
    if run.ranks < 2:
        return found
    rank0 = per_rank.get(0, Breakdown()).rank0_only
    if rank0 / step >= CAUSE_SHARE:
        found.append(
            Cause(
                "rank0-work",
                [0],
                rank0 / step,
                f"rank 0 spends {rank0:.1f} ms a step on work only it does (rank-0-guarded "
                "code, extensions only it runs) while the others wait at the next collective; "
                "run it less often (a larger trigger) or outside the training loop",
            )
        )
    for s in run.stragglers:
        late = s.mean_late_ms
        if s.rank == 0:
            late -= rank0  # rank 0 late because of its own guarded work is rank0-work
        if late / step >= CAUSE_SHARE:
            found.append(
                Cause(
                    "straggler",
                    [s.rank],
                    late / step,
                    f"rank {s.rank} is the last rank at {100 * s.late_fraction:.0f}% of steps, "
                    f"{late:.1f} ms late a step: find what it does more (its data, its device, "
                    "its host's load) or balance its work",
                )
            )
    if mean.mean_grad / step >= CAUSE_SHARE:
        grad = run.attribution.gradient_bytes
        ms = run.attribution.gradient_ms
        speed = f", {grad / (ms / 1e3) / 1e6:.0f} MB/s measured" if grad and ms > 0 else ""
        found.append(
            Cause(
                "communication-bound",
                list(range(run.ranks)),
                mean.mean_grad / step,
                f"averaging gradients takes {mean.mean_grad:.1f} ms a step (gradients "
                f"{_mb(grad)}{speed}): a larger per-rank batch amortises it; "
                "allreduce_grad_dtype='float16' halves the bytes",
            )
        )
    slow_data = [r for r, b in sorted(per_rank.items()) if b.data / step >= CAUSE_SHARE]
    if mean.data / step >= CAUSE_SHARE:
        found.append(
            Cause(
                "data-loading",
                slow_data,
                mean.data / step,
                f"ranks wait {mean.data:.1f} ms a step for their iterator's next batch: "
                "load examples in parallel with chainer.iterators.MultiprocessIterator "
                "(n_processes=...)",
            )
        )
    batch = run.attribution.batch_per_rank
    if run.attribution.on_gpu and batch and min(batch.values()) < SMALL_BATCH:
        small = min(batch.values())
        found.append(
            Cause(
                "small-batch",
                [r for r, b in sorted(batch.items()) if b < SMALL_BATCH],
                mean.compute / step,
                f"{small:.0f} examples per rank do not keep a GPU busy: raise the per-rank batch",
            )
        )
    return found


def speedup(runs: Sequence[Run]) -> tuple[float, float]:
    """Throughput speed-up of the largest count over the smallest, and the efficiency."""
    if len(runs) < 2:
        return 1.0, 1.0
    small = min(runs, key=lambda r: r.ranks)
    large = max(runs, key=lambda r: r.ranks)
    if small.examples_per_s <= 0:
        return 0.0, 0.0
    gain = large.examples_per_s / small.examples_per_s
    return gain, gain / (large.ranks / small.ranks)


def as_data(runs: Sequence[Run], found: Sequence[Cause]) -> dict[str, Any]:
    """``--json``'s document."""
    gain, efficiency = speedup(runs)
    return {
        "schema": SCHEMA,
        "runs": [
            {
                "ranks": r.ranks,
                "update_ms": round(r.update_ms, 3),
                "update_ms_spread": round(r.update_ms_spread, 3),
                "examples_per_s": round(r.examples_per_s, 3),
                "breakdown_ms": r.breakdown.as_dict(),
                "batch_phases": [dataclasses.asdict(p) for p in r.batch_phases],
            }
            for r in runs
        ],
        "speedup": round(gain, 4),
        "efficiency": round(efficiency, 4),
        "causes": [c.as_dict() for c in found],
    }


def render(runs: Sequence[Run], found: Sequence[Cause], warmup: int, updates: int) -> list[str]:
    """The report as text."""
    lines = [
        f"mnify scale: {updates} updates measured after {warmup} warm-up ones, at each count",
        f"{'ranks':>5} {'update ms':>10} {'spread':>8} {'examples/s':>11} {'speed-up':>9} "
        f"{'efficiency':>10}   " + " ".join(f"{p:>10}" for p in PARTS),
    ]
    base = min(runs, key=lambda r: r.ranks) if runs else None
    for r in runs:
        assert base is not None
        gain = r.examples_per_s / base.examples_per_s if base.examples_per_s else 0.0
        eff = gain / (r.ranks / base.ranks)
        b = r.breakdown
        lines.append(
            f"{r.ranks:>5} {r.update_ms:>10.1f} {r.update_ms_spread:>8.1f} "
            f"{r.examples_per_s:>11.1f} {gain:>8.2f}x {100 * eff:>9.0f}%   "
            + " ".join(f"{getattr(b, p):>10.1f}" for p in PARTS)
        )
    for r in runs:
        if r.same_data_note:
            lines.append(
                f"mnify scale: not-split not checked at {r.ranks} ranks: {r.same_data_note}"
            )
    if runs and not all(r.batch_known for r in runs):
        lines.append(
            "mnify scale: no iterator seen: examples/s counts one example per rank and update "
            "(it assumes the per-rank batch stays the same)"
        )
    cores = os.cpu_count() or 1
    for r in runs:
        if r.load[0] > cores:
            lines.append(
                f"mnify scale: note: load average {r.load[0]:.1f} on {cores} cores after the "
                f"{r.ranks}-rank run: the machine was busy, the times are pessimistic"
            )
    for r in runs:
        lines += batch_phases.render(r.batch_phases, f"mnify scale: {r.ranks} rank(s):")
    lines += _compute_note(runs)
    if found:
        for c in found:
            who = ", ".join(str(x) for x in c.ranks)
            lines.append(
                f"mnify scale: cause {c.kind} (rank {who}, {100 * c.share:.0f}% of the step): "
                f"{c.message}"
            )
    else:
        lines.append("mnify scale: no cause found: nothing costs 15% of the step or more")
    return lines


COMPUTE_GROWTH = 1.3  # compute per update this much longer at the largest count is noted


def _compute_note(runs: Sequence[Run]) -> list[str]:
    """Compute per update that grew with the rank count at the same per-rank batch: the ranks
    share something (cores, a device, memory bandwidth). Not a cause of the list, but the
    reason, when it is, that no cause is named and yet the speed-up is missing."""
    if len(runs) < 2:
        return []
    small, large = min(runs, key=lambda r: r.ranks), max(runs, key=lambda r: r.ranks)
    before, after = small.breakdown.compute, large.breakdown.compute
    batches = [r.attribution.batch_per_rank for r in (small, large)]
    same_batch = all(batches) and {round(b) for d in batches for b in d.values()} == {
        round(next(iter(batches[0].values())))
    }
    if before <= 0 or after < COMPUTE_GROWTH * before or (all(batches) and not same_batch):
        return []
    cores = os.cpu_count() or 1
    return [
        f"mnify scale: note: compute per update grew {after / before:.2f}x from {small.ranks} "
        f"to {large.ranks} ranks at the same per-rank batch: the ranks compete for what they "
        f"share ({cores} cores here, load {large.load[0]:.1f}; one device or memory bandwidth)"
    ]


def plot(runs: Sequence[Run], path: str | os.PathLike[str]) -> None:
    """Stacked bars of the breakdown per count, with the ideal and the measured throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [r.ranks for r in runs]
    labels = [str(c) for c in counts]
    fig, (bars, line) = plt.subplots(1, 2, figsize=(11, 4.2))
    bottom = [0.0] * len(runs)
    names = {
        "compute": "compute",
        "mean_grad": "gradient averaging",
        "wait": "waiting for ranks",
        "data": "waiting for data",
        "rank0_only": "rank 0 only",
    }
    for part in PARTS:
        values = [getattr(r.breakdown, part) for r in runs]
        bars.bar(labels, values, bottom=bottom, label=names[part])
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    bars.errorbar(labels, [r.update_ms for r in runs], yerr=[r.update_ms_spread / 2 for r in runs],
                  fmt="k_", capsize=6, label="median update (IQR)")  # fmt: skip
    bars.set_xlabel("ranks")
    bars.set_ylabel("ms per update (mean over steps and ranks)")
    bars.set_title("Where a step goes")
    bars.legend(fontsize=8)
    base = runs[0]
    measured = [r.examples_per_s for r in runs]
    ideal = [base.examples_per_s * r.ranks / base.ranks for r in runs]
    line.plot(counts, ideal, "--", color="gray", label="ideal (linear)")
    line.plot(counts, measured, "o-", label="measured")
    line.set_xticks(counts)
    line.set_xlabel("ranks")
    line.set_ylabel("examples per second (all ranks)")
    line.set_title("Throughput")
    line.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass
class Launched:
    """What one launch left: mpiexec's status, the ranks' stop reports, and ``--verify``'s
    findings (``check`` and ``ranks`` each) when it was asked for."""

    status: int
    stops: list[Any]
    verify_findings: list[tuple[str, list[int]]] | None = None


# launch(n, extra environment, scale updates or None, verify updates or None, log) -> what it left
Launch = Callable[[int, dict[str, str], "int | None", "int | None", Any], Launched]
VERIFY_UPDATES = 3  # a --verify run this long at the largest count checks that data is split


def _check_same_data(run: Run, launch: Launch, directory: Path, say: Callable[[str], None]) -> None:
    """``mnify run --verify``'s same-data check, in a short run of its own at ``run``'s count
    (its hashing of every example would slow the measured run)."""
    say(f"mnify scale: {run.ranks} rank(s): --verify for {VERIFY_UPDATES} updates (same-data) ...")
    with open(directory / "verify.log", "w", encoding="utf-8") as log:
        launched = launch(run.ranks, {}, None, VERIFY_UPDATES, log)
    if launched.verify_findings is None or not launched.stops:
        run.same_data_note = f"--verify did not report (exit status {launched.status})"
        return
    ranks = sorted(
        {r for check, rs in launched.verify_findings if check == "same-data" for r in rs}
    )
    run.same_data = ranks


def measure(
    counts: Sequence[int],
    launch: Launch,
    *,
    warmup: int,
    updates: int,
    say: Callable[[str], None],
    check_split: bool = True,
) -> list[Run]:
    """Run at each count and measure it; then, at the largest count of two ranks or more,
    check with ``--verify`` that the ranks train on different data. Raises
    :class:`ScaleError` for a run that cannot be measured."""
    runs = []
    for n in counts:
        directory = Path(tempfile.mkdtemp(prefix=f"mnify-scale-{n}-"))
        log_path = directory / "output.log"
        try:
            env = {environment.TIMELINE.name: str(directory / "ranks")}
            say(f"mnify scale: {n} rank(s): {warmup} + {updates} updates ...")
            with open(log_path, "w", encoding="utf-8") as log:
                launched = launch(n, env, warmup + updates + 1, None, log)
            load = os.getloadavg()
            if launched.status != 0 or not launched.stops:
                tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
                why = "failed" if launched.status else f"ended before update {warmup + updates + 1}"
                raise ScaleError(
                    f"the {n}-rank run {why} (exit status {launched.status}); its last lines:\n"
                    + "\n".join(tail)
                )
            merged = timeline_merge.merge_directory(directory / "ranks", expected_size=n)
            runs.append(measure_trace(merged.trace, n, warmup, updates, load))
            if check_split and n == max(counts) and n >= 2:
                _check_same_data(runs[-1], launch, directory, say)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return runs
