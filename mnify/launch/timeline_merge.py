"""One Chrome trace from the ranks' timeline files (``mnify run --timeline``, ``mnify timeline
--merge``).

Each rank left ``DIR/rank-R.timeline`` (:mod:`mnify.runtime.timeline`). The merge reads them all,
moves every rank's events onto rank 0's clock with the offsets the ranks measured when their
communicators were made, and writes the JSON Object Format of the Trace Event Format, which
Perfetto (ui.perfetto.dev) and chrome://tracing open::

    {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"mnify": {...}}}

One process per rank (``pid`` = rank, named ``rank R (host)``), thread 0 for what the host did
(collectives, their buckets, pack/unpack, updates), threads 1 and 2 for what the GPU did
(communication, optimizer) when CUDA events timed it. Every event is a complete event
(``"ph": "X"``) with ``ts``/``dur`` in microseconds from the first event of the job; ``args``
carry ``step``, ``seq`` (the collective's number on its communicator), ``comm`` (a key naming
the communicator alike on each of its ranks) and ``bytes``. An event a rank never finished
(killed, or still hanging when read) lasts to the end of the trace and says ``unfinished``.

``otherData.mnify`` holds what the straggler report needs beside the events: the world size,
the ranks present and missing, each rank's clock offset and its error bound, each
communicator's size.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mnify.runtime.errors import format_ranks
from mnify.runtime.timeline import (
    FLAG_ERROR,
    FLAG_SKIPPED,
    Category,
    Event,
    RankTimeline,
    TimelineFileError,
    rank_of_file,
    read_file,
)

SCHEMA = 1
HOST_TID, GPU_COMM_TID, GPU_OPTIMIZER_TID = 0, 1, 2
THREAD_NAMES = {
    HOST_TID: "host",
    GPU_COMM_TID: "GPU: communication",
    GPU_OPTIMIZER_TID: "GPU: optimizer",
}
CATEGORY_NAMES = {
    Category.COLLECTIVE: "collective",
    Category.P2P: "p2p",
    Category.BUCKET: "bucket",
    Category.PACK: "pack",
    Category.UNPACK: "unpack",
    Category.UPDATE: "update",
    Category.APPLY: "optimizer",
    Category.DEVICE: "gpu",
    Category.STEP: "step",
    Category.DATA: "data",
    Category.EXTENSION: "extension",
    Category.RANK0: "rank0",
}
METADATA_NAMES = ("process_name", "process_sort_index", "thread_name", "thread_sort_index")


class MergeError(Exception):
    """The files cannot be merged (none there, unreadable, of different jobs, ranks missing)."""


class MissingRanks(MergeError):
    """Some ranks of the job left no file in the directory."""

    def __init__(
        self,
        directory: Path,
        missing: list[int],
        size: int,
        hosts: dict[int, str],
        then: str = "merge again (or pass --allow-missing to merge the ranks that are here)",
    ) -> None:
        self.directory, self.missing, self.size, self.hosts = directory, missing, size, hosts
        where = sorted({hosts[r] for r in missing if r in hosts})
        on = f" (they ran on {', '.join(where)})" if where else ""
        word = "rank" if len(missing) == 1 else "ranks"
        super().__init__(
            f"{directory}: no timeline from {word} {format_ranks(missing)} of {size}{on}. "
            "Each rank writes DIR/rank-R.timeline on its own host: without a filesystem shared "
            f"by the hosts, copy those files into this directory, then {then}"
        )


@dataclass(frozen=True)
class ClockOffset:
    """A rank's clock minus rank 0's, and a bound on the estimate's error (half a round trip
    along the path of measurements that linked it to rank 0)."""

    offset_ns: int
    error_ns: int
    linked: bool  # False: no measurement reached this rank (its times are its own)


@dataclass
class Merged:
    trace: dict[str, Any]
    size: int
    ranks: list[int]
    missing: list[int]
    offsets: dict[int, ClockOffset]
    warnings: list[str] = field(default_factory=list)
    hosts: dict[int, str] = field(default_factory=dict)  # world rank -> host, as far as known


def read_directory(directory: str | os.PathLike[str]) -> list[RankTimeline]:
    """Every ``rank-R.timeline`` in ``directory``, read."""
    root = Path(directory)
    try:
        numbered = [(rank_of_file(p), p) for p in root.iterdir()]
        files = [p for rank, p in sorted((r, p) for r, p in numbered if r is not None)]
    except OSError as exc:
        raise MergeError(f"{root}: {exc.strerror or exc}") from exc
    if not files:
        raise MergeError(
            f"{root}: no timeline files (rank-R.timeline): was MNIFY_TIMELINE={root} set?"
        )
    try:
        return [read_file(p) for p in files]
    except TimelineFileError as exc:
        raise MergeError(str(exc)) from exc


def clock_offsets(timelines: Sequence[RankTimeline]) -> dict[int, ClockOffset]:
    """Each rank's offset from the reference rank's clock (rank 0, else the lowest present).

    The measurements link ranks in pairs (a rank and its communicator's rank 0); the path of
    smallest total round trip decides, so a rank measured against several references uses
    its best link.
    """
    ranks = sorted(t.rank for t in timelines)
    if not ranks:
        return {}
    edges: dict[int, list[tuple[int, int, int]]] = {r: [] for r in ranks}
    for t in timelines:
        for c in t.clocks:
            ref = int(c["ref"])
            if ref == t.rank or ref not in edges:
                continue
            offset, rtt = int(c["offset_ns"]), max(0, int(c["rtt_ns"]))
            edges[t.rank].append((ref, -offset, rtt))  # ref's clock minus this rank's
            edges[ref].append((t.rank, offset, rtt))
    root = 0 if 0 in edges else ranks[0]
    best: dict[int, tuple[int, int]] = {root: (0, 0)}  # rank -> (total rtt, offset from root)
    queue = [(0, root)]
    done: set[int] = set()
    while queue:
        cost, rank = heapq.heappop(queue)
        if rank in done:
            continue
        done.add(rank)
        base = best[rank][1]
        for other, delta, rtt in edges[rank]:
            total = cost + rtt
            if other not in best or total < best[other][0]:
                best[other] = (total, base + delta)
                heapq.heappush(queue, (total, other))
    return {
        r: ClockOffset(best[r][1], best[r][0] // 2, True) if r in best else ClockOffset(0, 0, False)
        for r in ranks
    }


def _job_token(t: RankTimeline) -> tuple[int, ...] | None:
    for job in t.jobs:
        if int(job.get("size", -1)) == t.size:
            return tuple(int(v) for v in job.get("token", ()))
    return None


def _hosts_by_rank(timelines: Sequence[RankTimeline]) -> dict[int, str]:
    hosts: dict[int, str] = {}
    for t in timelines:
        hosts[t.rank] = t.host
        for comm in t.comms.values():
            for world, host in zip(
                comm.get("world_ranks", ()), comm.get("hosts", ()), strict=False
            ):
                hosts.setdefault(int(world), str(host))
    return hosts


def merge_directory(
    directory: str | os.PathLike[str],
    *,
    expected_size: int | None = None,
    allow_missing: bool = False,
) -> Merged:
    """Merge ``directory``'s rank files; :class:`MissingRanks` when ranks of the job left none
    (unless ``allow_missing``)."""
    root = Path(directory)
    timelines = read_directory(root)
    sizes = {t.size for t in timelines if t.size > 0}
    if len(sizes) > 1:
        raise MergeError(
            f"{root}: files of jobs of different sizes ({', '.join(map(str, sorted(sizes)))} "
            "ranks): use an empty directory per job"
        )
    size = expected_size or (sizes.pop() if sizes else len(timelines))
    tokens = {tok for tok in (_job_token(t) for t in timelines) if tok is not None}
    if len(tokens) > 1:
        raise MergeError(f"{root}: files of different jobs: use an empty directory per job")
    present = sorted(t.rank for t in timelines)
    missing = sorted(set(range(size)) - set(present))
    if missing and not allow_missing:
        raise MissingRanks(root, missing, size, _hosts_by_rank(timelines))
    merged = merge(timelines, size)
    merged.hosts = _hosts_by_rank(timelines)
    return merged


def _unfinished(t: RankTimeline) -> bool:
    return any(e.end is None for e in t.events)


def merge(timelines: Sequence[RankTimeline], size: int) -> Merged:
    """The Chrome trace of ``timelines`` (ranks of a job of ``size`` ranks)."""
    offsets = clock_offsets(timelines)
    warnings: list[str] = []
    for t in timelines:
        if not offsets[t.rank].linked and len(timelines) > 1:
            warnings.append(f"rank {t.rank}: no clock offset measured; its times are its own")
        if t.written > t.capacity:
            warnings.append(
                f"rank {t.rank}: the oldest {t.written - t.capacity} events were overwritten "
                "(raise mnify run --timeline-events to keep more)"
            )
        if t.damaged:
            warnings.append(f"rank {t.rank}: {t.damaged} events did not read back whole")
        if not t.exited:
            open_event = " (it was inside an event that never ended)" if _unfinished(t) else ""
            warnings.append(f"rank {t.rank}: the process did not exit normally{open_event}")
    starts = [e.start - offsets[t.rank].offset_ns for t in timelines for e in t.events]
    origin = min(starts) if starts else 0
    ends = [
        (e.end if e.end is not None else e.start) - offsets[t.rank].offset_ns
        for t in timelines
        for e in t.events
    ]
    last = max(ends) if ends else origin
    events: list[dict[str, Any]] = []
    comms: dict[str, dict[str, Any]] = {}
    for t in sorted(timelines, key=lambda x: x.rank):
        keys = {cid: str(c.get("key", cid)) for cid, c in t.comms.items()}
        for c in t.comms.values():
            comms.setdefault(
                str(c.get("key")), {"size": int(c.get("size", 0)), "class": c.get("class")}
            )
        events += _metadata(t)
        shift = offsets[t.rank].offset_ns + origin
        for e in t.events:
            events.append(_event(t.rank, e, shift, last - origin, keys))
    events.sort(key=lambda ev: (ev["ph"] != "M", ev.get("ts", 0.0)))
    ranks = sorted(t.rank for t in timelines)
    missing = sorted(set(range(size)) - set(ranks))
    other = {
        "schema": SCHEMA,
        "size": size,
        "ranks": ranks,
        "missing_ranks": missing,
        "clock_offsets_ms": {str(r): o.offset_ns / 1e6 for r, o in sorted(offsets.items())},
        "clock_error_ms": {str(r): o.error_ns / 1e6 for r, o in sorted(offsets.items())},
        "communicators": comms,
        "hosts": {str(t.rank): t.host for t in timelines},
        "warnings": warnings,
    }
    trace = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"mnify": other}}
    return Merged(trace, size, ranks, missing, offsets, warnings)


def _metadata(t: RankTimeline) -> list[dict[str, Any]]:
    label = f"rank {t.rank}" + (f" ({t.host})" if t.host else "")
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": t.rank, "tid": 0, "args": {"name": label}},
        {
            "name": "process_sort_index",
            "ph": "M",
            "pid": t.rank,
            "tid": 0,
            "args": {"sort_index": t.rank},
        },
    ]
    tids = {HOST_TID} | {_tid(e) for e in t.events}
    for tid in sorted(tids):
        out.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": t.rank,
                "tid": tid,
                "args": {"name": THREAD_NAMES[tid]},
            }
        )
        out.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": t.rank,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    return out


def _tid(e: Event) -> int:
    if e.cat != Category.DEVICE:
        return HOST_TID
    return GPU_OPTIMIZER_TID if e.aux == Category.APPLY else GPU_COMM_TID


def _event(
    rank: int, e: Event, shift: int, end_of_trace: int, keys: dict[int, str]
) -> dict[str, Any]:
    start = e.start - shift
    end = e.end - shift if e.end is not None else max(start, end_of_trace)
    args: dict[str, Any] = {"step": e.step}
    if e.comm >= 0:
        args["comm"] = keys.get(e.comm, str(e.comm))
    # seq: the collective's number (of the one an event belongs to); bucket: its bucket's
    if e.cat in (Category.COLLECTIVE, Category.P2P, Category.STEP):
        args["seq"] = e.seq
    elif e.cat == Category.DATA and e.aux >= 0:
        args["examples"] = e.aux
    if e.cat == Category.BUCKET:
        args["seq"], args["bucket"] = e.aux, e.seq
    elif e.cat in (Category.PACK, Category.UNPACK):
        args["seq"], args["bucket"] = e.seq, e.aux
    elif e.cat == Category.P2P:
        args["peer"] = e.aux
    if e.cat == Category.DEVICE:
        if e.comm >= 0:
            args["seq"] = e.seq
        args["of"] = CATEGORY_NAMES[Category(e.aux)] if e.aux in _CATS else str(e.aux)
    if e.cat == Category.UPDATE:  # a global-batch step: its batch, this rank's share
        if e.nbytes:
            args["global_batch"] = e.nbytes
        if e.aux >= 0:
            args["share"] = e.aux
        if e.seq > 1:
            args["micro_batches"] = e.seq
    elif e.nbytes:
        args["bytes"] = e.nbytes
    if e.flags & FLAG_ERROR:
        args["error"] = True
    if e.flags & FLAG_SKIPPED:
        args["skipped"] = True
    if e.end is None:
        args["unfinished"] = True
    return {
        "name": e.name,
        "cat": CATEGORY_NAMES[e.cat],
        "ph": "X",
        "ts": round(start / 1e3, 3),
        "dur": round(max(0, end - start) / 1e3, 3),
        "pid": rank,
        "tid": _tid(e),
        "args": args,
    }


_CATS = {int(c) for c in Category}


def write_trace(path: str | os.PathLike[str], trace: dict[str, Any]) -> None:
    """Write ``trace`` to ``path`` whole (a temporary file, then a rename)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp{os.getpid()}")
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(trace, out, separators=(",", ":"))
        out.write("\n")
    os.replace(temporary, target)


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A trace file written by :func:`write_trace` (or any Trace Event Format object)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise MergeError(f"{path}: {exc}") from exc
    if isinstance(data, list):  # the JSON Array Format
        data = {"traceEvents": data}
    problems = validate(data)
    if problems:
        raise MergeError(f"{path}: not a valid trace: {problems[0]}")
    return data  # type: ignore[no-any-return]


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def validate(trace: Any) -> list[str]:
    """Problems that keep ``trace`` from being a Trace Event Format object as written here
    (every event checked); [] when there are none."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["the top level must be an object with a 'traceEvents' list"]
    problems: list[str] = []
    for i, ev in enumerate(trace["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(ev, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = ev.get("ph")
        if not isinstance(ev.get("name"), str):
            problems.append(f"{where}: 'name' must be a string")
        if not isinstance(ev.get("pid"), int) or not isinstance(ev.get("tid"), int):
            problems.append(f"{where}: 'pid' and 'tid' must be integers")
        if "args" in ev and not isinstance(ev["args"], dict):
            problems.append(f"{where}: 'args' must be an object")
        if ph == "X":
            if not isinstance(ev.get("cat", ""), str):
                problems.append(f"{where}: 'cat' must be a string")
            if not _number(ev.get("ts")) or not _number(ev.get("dur")):
                problems.append(f"{where}: 'ts' and 'dur' must be finite numbers")
            elif ev["dur"] < 0:
                problems.append(f"{where}: negative 'dur'")
        elif ph == "M":
            if ev.get("name") not in METADATA_NAMES or not isinstance(ev.get("args"), dict):
                problems.append(f"{where}: metadata event needs a known name and 'args'")
        else:
            problems.append(f"{where}: phase {ph!r} is not one this trace writes ('X', 'M')")
        if len(problems) > 20:
            break
    return problems


# -- mnify run --timeline ---------------------------------------------------------------------


def run_directory(trace_path: str | os.PathLike[str]) -> Path:
    """Where the ranks of ``mnify run --timeline FILE`` write: ``FILE.ranks`` beside the trace
    (absolute, so ranks on other hosts name the same path; shared where FILE's directory is)."""
    trace = Path(trace_path).absolute()
    return trace.with_name(trace.name + ".ranks")


def prepare_run_directory(directory: Path) -> None:
    """Create ``directory``, without the rank files of an earlier run."""
    directory.mkdir(parents=True, exist_ok=True)
    for p in directory.iterdir():
        if rank_of_file(p) is not None:
            p.unlink()


def _remove_rank_files(directory: Path) -> None:
    """The rank files, then the directory if nothing else is in it."""
    try:
        for p in directory.iterdir():
            if rank_of_file(p) is not None:
                p.unlink()
        directory.rmdir()
    except OSError:
        pass


@dataclass
class RunTimeline:
    """What ``mnify run`` says and records about the timeline once the job is over."""

    lines: list[str]
    stragglers: list[dict[str, Any]]


def finish_run(trace_path: str | os.PathLike[str], directory: Path, nprocs: int) -> RunTimeline:
    """Merge the job's rank files into ``trace_path`` and look for stragglers.

    The rank files are removed once every rank's are merged; otherwise they stay, and the
    lines say how to complete the trace.
    """
    from mnify.launch import attribution, batch_phases, stragglers

    say = "mnify run: timeline:"
    try:
        merged = merge_directory(directory, expected_size=nprocs, allow_missing=True)
        write_trace(trace_path, merged.trace)
    except (MergeError, OSError) as exc:
        return RunTimeline([f"{say} {exc}"], [])
    events = sum(1 for ev in merged.trace["traceEvents"] if ev["ph"] == "X")
    lines = [
        f"{say} {trace_path}: {events} events of {len(merged.ranks)} of {nprocs} ranks "
        "(open it in https://ui.perfetto.dev or chrome://tracing)"
    ]
    lines += [f"{say} {w}" for w in merged.warnings]
    if merged.missing:
        then = f"mnify timeline --merge {directory} -o {trace_path}"
        lines.append(f"{say} {MissingRanks(directory, merged.missing, nprocs, merged.hosts, then)}")
    else:
        _remove_rank_files(directory)
    lines += attribution.render(attribution.attribute(merged.trace), say)
    lines += batch_phases.render(batch_phases.phases(merged.trace), say)
    report = stragglers.analyze(merged.trace)
    lines += [stragglers.straggler_line(s) for s in report.stragglers]
    return RunTimeline(lines, stragglers.as_data(report))
