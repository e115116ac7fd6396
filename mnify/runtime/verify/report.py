"""What ``--verify`` found, as data (``--summary-json``'s ``verify`` key) and as the verdict
block that ``mnify run`` (or rank 0 under a plain mpiexec) prints. No Chainer, no MPI here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mnify.runtime.errors import format_ranks

CHECKS = ("same-data", "params-differ", "unwrapped-optimizer", "rank-writes")


@dataclass(frozen=True)
class Finding:
    check: str  # one of CHECKS
    ranks: list[int]
    where: str  # the user's file:line
    message: str


@dataclass
class VerifyReport:
    updates: int
    findings: list[Finding] = field(default_factory=list)
    per_rank_batch: dict[str, int] = field(default_factory=dict)
    global_batch: int | None = None
    iterations_per_epoch: dict[str, int] = field(default_factory=dict)
    optimizers: list[dict[str, Any]] = field(default_factory=list)  # name, multi_node, lr
    model_parallel: list[str] = field(default_factory=list)  # why the run is judged as such

    def as_data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> VerifyReport:
        findings = [Finding(**f) for f in data.get("findings", [])]
        rest = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "findings"}
        return cls(findings=findings, **rest)


def _ranks(ranks: list[int]) -> str:
    return f"rank {format_ranks(ranks)}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def render(report: VerifyReport, nprocs: int) -> list[str]:
    """The verdict block: one line per finding, then the facts a person checks the run by."""
    if report.updates == 0 and not report.findings:
        return [
            f"mnify verify (on {nprocs} ranks): no update was verified (the job ended before "
            "its first optimizer update, or rank 0 could not report)"
        ]
    count = len(report.findings)
    verdict = (
        f"{count} finding{'s' if count != 1 else ''}"
        if count
        else "no finding for a model-parallel run"
        if report.model_parallel
        else "no finding: the ranks trained data-parallel"
    )
    out = [f"mnify verify ({report.updates} updates on {nprocs} ranks): {verdict}"]
    for f in report.findings:
        out.append(f"  {f.check}: {_ranks(f.ranks)} at {f.where}: {f.message}")
    if report.model_parallel:
        out.append(f"  judged as model-parallel: {'; '.join(report.model_parallel)}")
    if report.per_rank_batch:
        sizes = sorted(set(report.per_rank_batch.values()))
        per_rank = (
            str(sizes[0])
            if len(sizes) == 1
            else ", ".join(f"{r}: {b}" for r, b in report.per_rank_batch.items())
        )
        out.append(f"  batch: {per_rank} per rank, {report.global_batch} global")
    if report.iterations_per_epoch:
        its = sorted(set(report.iterations_per_epoch.values()))
        out.append(f"  iterations per epoch: {', '.join(map(str, its))}")
    for opt in report.optimizers:
        lr = "" if opt.get("lr") is None else f", lr {opt['lr']:.6g}"
        kind = "multi-node" if opt.get("multi_node") else "plain"
        out.append(f"  optimizer {opt['name']}: {kind}{lr}")
    return out
