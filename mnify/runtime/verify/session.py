"""The verification of one run: the observer of updates, the records, the exchange at the stop."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from mnify import environment
from mnify.runtime import update_watch, user_frames
from mnify.runtime.verify import examples, params
from mnify.runtime.verify.judge import RankRecord, judge
from mnify.runtime.verify.rank_writes import WriteRecorder
from mnify.runtime.verify.report import render

_TAG_RECORD, _TAG_VERDICT = 7301, 7302
MAX_DRAWN = 100_000
REPORT_PREFIX = "[mnify] verify report: "  # mnify.launch.rank_reports.VERIFY_REPORT_PREFIX


@dataclass
class _Optimizer:
    key: str
    name: str
    multi_node: bool
    where: str
    target: Any
    skip: frozenset[str]
    model_parallel: list[str]


def _communicator_exists() -> bool:
    module = sys.modules.get("mnify.runtime.communicators")
    return module is not None and getattr(module, "_current", None) is not None


@dataclass
class VerifySession:
    updates: int
    mpi: Any = None
    rank: int = 0
    size: int = 1
    optimizers: dict[int, _Optimizer] = field(default_factory=dict)
    digests: dict[str, dict[int, dict[str, int]]] = field(default_factory=dict)
    unwrapped: dict[str, str] = field(default_factory=dict)
    learning_rates: dict[str, float | None] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # updates seen per optimizer
    judged: bool = False
    recorder: examples.ExampleRecorder = field(default_factory=examples.ExampleRecorder)
    writes: WriteRecorder = field(default_factory=WriteRecorder)

    def begin(self) -> None:
        self.mpi = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.mpi.Get_rank(), self.mpi.Get_size()
        self.recorder.__enter__()  # a global link hook (this thread: the training loop's)
        if self.rank != 0:
            self.writes.install()
        update_watch.watch_updates(self)
        update_watch.stop_after_updates(self.updates, "verify", self._at_stop)
        import atexit

        atexit.register(self._at_exit)  # after mpi4py's: runs before MPI_Finalize

    def _at_exit(self) -> None:
        """The script ended before K updates: judge what it did (the exit status stays)."""
        if not self.judged and MPI.Is_initialized() and not MPI.Is_finalized():
            self._at_stop(min(self.counts.values(), default=0))

    # -- update_watch observer -------------------------------------------------------------
    def before_update(self, optimizer: Any, index: int) -> None:
        info = self.optimizers.get(id(optimizer))
        if info is None:
            info = self._describe(optimizer)
            self.optimizers[id(optimizer)] = info
        self.learning_rates[info.key] = params.learning_rate(optimizer)
        if not info.multi_node and _communicator_exists() and self.size > 1:
            self.unwrapped.setdefault(info.key, info.where)

    def after_update(self, optimizer: Any, index: int) -> None:
        self.recorder.step_ended()
        info = self.optimizers[id(optimizer)]
        self.counts[info.key] = index
        if index <= self.updates and info.target is not None:
            self.digests.setdefault(info.key, {})[index] = params.param_digests(
                info.target, info.skip
            )

    def _describe(self, optimizer: Any) -> _Optimizer:
        actual = getattr(optimizer, "actual_optimizer", None)
        multi_node = actual is not None
        actual = actual if multi_node else optimizer
        target = getattr(actual, "target", None)
        target_name = type(target).__name__ if target is not None else "no model"
        name = f"{type(actual).__name__} on {target_name}"
        key = f"{len(self.optimizers)}:{name}"
        skip = params.channel_parallel_params(target) if target is not None else frozenset()
        reasons = params.model_parallel_reasons(target)
        where = user_frames.describe(user_frames.user_frame(sys._getframe(3)))
        return _Optimizer(key, name, multi_node, where, target, skip, reasons)

    # -- the stop ------------------------------------------------------------------------
    def _record(self) -> RankRecord:
        self.recorder.recording = False
        self.writes.recording = False
        drawn = self.recorder.hashes[:MAX_DRAWN]
        source = examples.find_source(drawn, self.recorder.row_shapes)
        reasons = [r for info in self.optimizers.values() for r in info.model_parallel]
        if _multi_node_iterator_alive():
            reasons.append("a multi-node iterator sends rank 0's batches to every rank")
        batches = Counter(c.batch for c in self.recorder.calls)
        return RankRecord(
            rank=self.rank,
            drawn=np.asarray(drawn, dtype=np.uint64),
            call_where=self.recorder.calls[0].where if self.recorder.calls else "?",
            source_what=source.what if source else "",
            source=np.asarray(source.hashes if source else [], dtype=np.uint64),
            digests=self.digests,
            optimizers=[
                {
                    "key": o.key,
                    "name": o.name,
                    "multi_node": o.multi_node,
                    "where": o.where,
                    "lr": self.learning_rates.get(o.key),
                }
                for o in self.optimizers.values()
            ],
            unwrapped=dict(self.unwrapped),
            writes=[(w.what, w.path, w.where) for w in self.writes.writes],
            per_rank_batch=batches.most_common(1)[0][0] if batches else None,
            iterations_per_epoch=examples.iterations_per_epoch(),
            model_parallel=sorted(set(reasons)),
        )

    def _at_stop(self, updates: int) -> int:
        self.judged = True
        record = self._record()
        deadline = time.monotonic() + _timeout()
        if self.rank == 0:
            records = [record]
            for source in range(1, self.size):
                records.append(self._receive(source, _TAG_RECORD, deadline))
            report = judge(records, updates)
            # under mnify run the launcher sets the status from the report: the ranks exit 0
            launcher = environment.LAUNCH.read().verify_report
            code = 1 if report.findings and not launcher else 0
            self._say(report)
            for dest in range(1, self.size):
                self.mpi.send(code, dest=dest, tag=_TAG_VERDICT)
        else:
            request = self.mpi.isend(record, dest=0, tag=_TAG_RECORD)
            code = int(self._receive(0, _TAG_VERDICT, deadline))
            request.wait()
        return code

    def _receive(self, source: int, tag: int, deadline: float) -> Any:
        status = MPI.Status()
        while not self.mpi.Iprobe(source=source, tag=tag, status=status):
            if time.monotonic() > deadline:
                from mnify.runtime.abort import abort_job

                who = f"rank {source}" if self.rank == 0 else "rank 0"
                sys.stderr.write(
                    f"[mnify] verify: {who} did not reach the stop after update {self.updates} "
                    f"within {_timeout():g} s (ranks updating a different number of times?)\n"
                )
                sys.stderr.flush()
                abort_job(1)
            time.sleep(0.005)
        return self.mpi.recv(source=source, tag=tag)

    def _say(self, report: Any) -> None:
        import json

        sys.stdout.flush()
        if environment.LAUNCH.read().verify_report:
            sys.stderr.write(REPORT_PREFIX + json.dumps(report.as_data()) + "\n")
        else:
            sys.stderr.write("\n".join(render(report, self.size)) + "\n")
        sys.stderr.flush()


def _multi_node_iterator_alive() -> bool:
    module = sys.modules.get("mnify.runtime.iterators.multi_node_iterator")
    if module is None:
        return False
    import gc

    cls = module.MultiNodeIterator
    return any(isinstance(o, cls) for o in gc.get_objects())


DEFAULT_TIMEOUT = 120.0
"""Seconds rank 0 waits at the stop for a rank, unless ``mnify run --verify-timeout`` says."""
_timeout_given: float | None = None


def _timeout() -> float:
    """``start``'s timeout, else ``mnify run --verify-timeout`` (in ``MNIFY_LAUNCH``), else
    :data:`DEFAULT_TIMEOUT`."""
    if _timeout_given is not None:
        return _timeout_given
    return environment.LAUNCH.read_or_default().verify_timeout or DEFAULT_TIMEOUT


_session: VerifySession | None = None


def start(updates: int, timeout: float | None = None) -> VerifySession:
    """Begin verifying (collective over COMM_WORLD: every rank calls it); once per process.
    ``timeout``: seconds rank 0 waits at the stop for a rank (at least 1)."""
    global _session, _timeout_given
    if timeout is not None:
        _timeout_given = max(1.0, timeout)
    if _session is None:
        _session = VerifySession(updates)
        _session.begin()
    return _session


def active() -> VerifySession | None:
    return _session
