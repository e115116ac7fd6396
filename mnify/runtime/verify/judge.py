"""Rank 0's judgement: every rank's record in, the report (findings and facts) out.

Pure functions of the records, so that each rule is tested without MPI (tests/verify/).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnify.runtime.errors import format_ranks
from mnify.runtime.verify.report import Finding, VerifyReport

# two ranks' sources that share at least this share of the smaller one are the same data
SAME_SOURCE_SHARE = 0.5
MAX_PATHS_NAMED = 3


@dataclass
class RankRecord:
    """What one rank saw in the verified updates (sent to rank 0 at the stop)."""

    rank: int
    drawn: np.ndarray  # uint64 fingerprints of the examples that reached the model
    call_where: str  # the user's line of the first model call recorded
    source_what: str  # what the examples were drawn from ("" when not found)
    source: np.ndarray  # uint64 fingerprints of every example of that source
    digests: dict[str, dict[int, dict[str, int]]]  # optimizer key -> update -> path -> digest
    optimizers: list[dict[str, Any]]
    unwrapped: dict[str, str]  # optimizer key -> where it updates
    writes: list[tuple[str, str, str]]  # (what, path, where)
    per_rank_batch: int | None
    iterations_per_epoch: int | None
    model_parallel: list[str] = field(default_factory=list)


def _ranks(ranks: list[int]) -> str:
    return f"rank {format_ranks(ranks)}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _shared(sets: dict[int, np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """Fingerprints present on two or more ranks, and those ranks."""
    if len(sets) < 2:
        return np.zeros(0, np.uint64), []
    unique = [np.unique(v) for v in sets.values()]
    values, counts = np.unique(np.concatenate(unique), return_counts=True)
    shared = values[counts > 1]
    ranks = [r for r, v in sets.items() if np.isin(v, shared).any()] if shared.size else []
    return shared, ranks


def _repeated(values: np.ndarray) -> np.ndarray:
    unique, counts = np.unique(values, return_counts=True)
    return np.asarray(unique[counts > 1], np.uint64)


def _without(values: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    return values if not excluded.size else values[~np.isin(values, excluded)]


def _same_data(records: list[RankRecord], updates: int) -> list[Finding]:
    """The sources first (they catch a whole dataset shuffled differently on each rank, which
    K updates alone rarely show), then the examples themselves."""
    size = len(records)
    # An example whose content occurs twice in a rank's own source (a toy dataset of a few
    # patterns, a dataset concatenated with itself) says nothing about how data was split.
    repeated = [_repeated(r.source) for r in records if r.source.size]
    common = np.unique(np.concatenate(repeated)) if repeated else np.zeros(0, np.uint64)
    # a split of n examples over `size` ranks that repeats at most size - 1 of them
    # (force_equal_length) lets every rank run the same number of updates: not a finding
    sources = {r.rank: _without(r.source, common) for r in records if r.source.size}
    shared, ranks = _shared(sources)
    if shared.size > size - 1:
        smallest = min(int(np.unique(sources[r]).size) for r in ranks)
        if shared.size >= SAME_SOURCE_SHARE * smallest:
            first = next(r for r in records if r.rank == min(ranks))
            return [
                Finding(
                    "same-data",
                    ranks,
                    first.call_where,
                    f"{_ranks(ranks)} draw their training examples from the same "
                    f"{shared.size} examples ({first.source_what}): every rank trains on the "
                    "whole dataset, each in its own order (scatter it: mn.scatter_dataset, or "
                    "split it by comm.rank)",
                )
            ]
    drawn = {r.rank: _without(r.drawn, common) for r in records if r.drawn.size}
    shared, ranks = _shared(drawn)
    if shared.size > size - 1:
        first_rank = min(ranks)
        seen = int(np.unique(drawn[first_rank]).size)
        where = next(r.call_where for r in records if r.rank == first_rank)
        return [
            Finding(
                "same-data",
                ranks,
                where,
                f"{shared.size} of the {seen} examples rank {first_rank} trained on in the first "
                f"{updates} updates also reached the model on another rank: the ranks train on "
                "the same examples (scatter the dataset: mn.scatter_dataset, or split it by "
                "comm.rank)",
            )
        ]
    return []


def _names(records: list[RankRecord]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        for opt in r.optimizers:
            out.setdefault(opt["key"], opt)
    return out


def _params_differ(records: list[RankRecord]) -> list[Finding]:
    findings = []
    names = _names(records)
    keys = sorted({k for r in records for k in r.digests}, key=lambda k: int(k.split(":")[0]))
    for key in keys:
        per_rank = {r.rank: r.digests.get(key, {}) for r in records}
        updates = sorted(set.intersection(*(set(d) for d in per_rank.values())))
        for update in updates:
            paths = sorted(set.intersection(*(set(d[update]) for d in per_rank.values())))
            differing = [p for p in paths if len({d[update][p] for d in per_rank.values()}) > 1]
            if not differing:
                continue
            reference = per_rank[min(per_rank)][update]
            ranks = sorted(
                {r for r, d in per_rank.items() for p in differing if d[update][p] != reference[p]}
                | {min(per_rank)}
            )
            shown = ", ".join(differing[:MAX_PATHS_NAMED])
            more = len(differing) - MAX_PATHS_NAMED
            tail = f" and {more} more" if more > 0 else ""
            opt = names.get(key, {"name": key, "where": "?", "multi_node": True})
            why = (
                "it is not multi-node (mn.create_multi_node_optimizer)"
                if not opt["multi_node"]
                else "a rank changes weights on its own (outside the optimizer)"
            )
            findings.append(
                Finding(
                    "params-differ",
                    ranks,
                    opt["where"],
                    f"after update {update} of optimizer {opt['name']}, {shown}{tail} differ "
                    f"between {_ranks(ranks)}: {why}",
                )
            )
            break
    return findings


def _unwrapped(records: list[RankRecord]) -> list[Finding]:
    names = _names(records)
    by_key: dict[str, list[int]] = defaultdict(list)
    where: dict[str, str] = {}
    for r in records:
        for key, at in r.unwrapped.items():
            by_key[key].append(r.rank)
            where.setdefault(key, at)
    return [
        Finding(
            "unwrapped-optimizer",
            sorted(ranks),
            where[key],
            f"{names.get(key, {'name': key})['name']} is a plain Chainer optimizer updating "
            "while a communicator exists: its gradients are not averaged across ranks (wrap it: "
            "mn.create_multi_node_optimizer(optimizer, comm))",
        )
        for key, ranks in by_key.items()
    ]


def _rank_writes(records: list[RankRecord]) -> list[Finding]:
    by_write: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for r in records:
        if r.rank == 0:
            continue
        for write in r.writes:
            by_write[write].append(r.rank)
    return [
        Finding(
            "rank-writes",
            sorted(ranks),
            where,
            f"{_ranks(sorted(ranks))} {what} {path}: only rank 0 should write "
            "(if comm.rank == 0: ...), or give each rank its own file",
        )
        for (what, path, where), ranks in by_write.items()
    ]


def judge(records: list[RankRecord], updates: int) -> VerifyReport:
    """The findings and facts of a verified run, from every rank's record (rank order)."""
    records = sorted(records, key=lambda r: r.rank)
    model_parallel = sorted({m for r in records for m in r.model_parallel})
    findings: list[Finding] = []
    if not model_parallel:
        findings += _same_data(records, updates)
    findings += _params_differ(records)
    if not model_parallel:
        findings += _unwrapped(records)
    findings += _rank_writes(records)
    per_rank = {str(r.rank): int(r.per_rank_batch) for r in records if r.per_rank_batch}
    names = _names(records)
    lrs = records[0].optimizers if records else []
    return VerifyReport(
        updates=updates,
        findings=findings,
        per_rank_batch=per_rank,
        # model parallel: every rank sees the same batch, so the global batch is one rank's
        global_batch=(max if model_parallel else sum)(per_rank.values()) if per_rank else None,
        iterations_per_epoch={
            str(r.rank): int(r.iterations_per_epoch) for r in records if r.iterations_per_epoch
        },
        optimizers=[
            {"name": names[o["key"]]["name"], "multi_node": o["multi_node"], "lr": o["lr"]}
            for o in lrs
        ],
        model_parallel=model_parallel,
    )
