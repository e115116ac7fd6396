"""Collective watchdog: a collective that waits too long raises instead of hanging the job.

A rank that never arrives at a collective hangs every other rank forever (nnabla answers it
with ``NNABLA_MPI_WATCH_DOG_*``). With ``MNIFY_WATCHDOG_TIMEOUT=SECONDS`` set, communicators start
every MPI call non-blocking and :meth:`Watchdog.wait` polls it with ``Test()`` against a deadline
(spinning briefly, then sleeping in short steps so waiting ranks leave the CPU to the others).
On expiry it raises :class:`~mnify.runtime.errors.CollectiveTimeout` in the calling thread.

Who is missing: each rank counts the collectives it has entered (``entered``). A daemon responder
thread per watchdog answers "what is your counter?" on a private duplicate of the communicator.
The rank that timed out asks every other rank, with a short deadline of its own; ranks whose
counter is behind, or that do not answer, never arrived. The uncaught exception then ends the job
(:mod:`mnify.runtime.excepthook`).
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence

import numpy as np
from mpi4py import MPI

from mnify import environment
from mnify.runtime.errors import CollectiveTimeout

_QUERY_TAG = 7101
_REPLY_TAG = 7102
# Polling: this many Test() calls back to back, then sleeps doubling up to _MAX_SLEEP. Open MPI
# progresses non-blocking collectives only inside MPI calls, so the sleeps must stay short.
_SPIN_TESTS = 2000
_FIRST_SLEEP = 5e-5
_MAX_SLEEP = 1e-3
_RESPONDER_SLEEP = 0.02
# a reply: the collective counter (int64) then the collective's name (utf-8, zero padded)
_REPLY_BYTES = 40


def _encode(seq: int, kind: str) -> np.ndarray:
    out = np.zeros(_REPLY_BYTES, dtype=np.uint8)
    out[:8] = np.frombuffer(np.int64(seq).tobytes(), dtype=np.uint8)
    name = kind.encode()[: _REPLY_BYTES - 8]
    out[8 : 8 + len(name)] = np.frombuffer(name, dtype=np.uint8)
    return out


def _decode(reply: np.ndarray) -> tuple[int, str]:
    seq = int(np.frombuffer(reply[:8].tobytes(), dtype=np.int64)[0])
    return seq, reply[8:].tobytes().rstrip(b"\0").decode(errors="replace")


def timeout_from_env() -> float | None:
    """Seconds from ``MNIFY_WATCHDOG_TIMEOUT``; None (watchdog off) when unset, empty or <= 0."""
    value = environment.WATCHDOG_TIMEOUT.read()
    return value if value is not None and value > 0 else None


_live: weakref.WeakSet[Watchdog] = weakref.WeakSet()
_atexit_registered = False


def _close_all() -> None:
    for dog in list(_live):
        dog.close()


class Watchdog:
    """Deadline-bounded waits on one communicator's requests, plus its responder thread.

    Collective: every rank of ``comm`` must create it (it duplicates ``comm``).
    """

    def __init__(self, comm: MPI.Intracomm, timeout: float) -> None:
        global _atexit_registered
        self.timeout = float(timeout)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.entered = 0
        self.kind = ""
        self._state: tuple[int, str] = (0, "")
        self._peer: int | None = None
        self._deadline = 0.0
        self._queries = comm.Dup()
        self._stop = threading.Event()
        self._closed = False
        # The responder calls MPI beside the main thread: only safe under MPI_THREAD_MULTIPLE
        # (mpi4py's default). Without it timeouts still fire, but cannot say who is missing.
        self.can_ask = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._thread = threading.Thread(
            target=self._respond, name=f"mnify-watchdog-r{self.rank}", daemon=True
        )
        if self.can_ask:
            self._thread.start()
        _live.add(self)
        if not _atexit_registered:
            # Registered after mpi4py's own exit hook, so it runs first: the responder threads
            # stop before MPI is finalized underneath them.
            atexit.register(_close_all)
            _atexit_registered = True

    # -- the calling thread --------------------------------------------------------------------

    def start(self, kind: str, seq: int, peer: int | None = None, *, timed: bool = True) -> None:
        """A collective numbered ``seq`` begins now; its waits share one deadline.

        ``peer``: a point-to-point call with that rank (not counted as a collective); on expiry
        that rank is the one missing, no query needed. ``timed=False``: wait without a deadline
        (``barrier``, the explicit synchronisation point before timed collectives).
        """
        self.kind = kind
        self.entered = seq
        self._state = (seq, kind)  # read by the responder thread: one atomic assignment
        self._peer = peer
        self._deadline = time.monotonic() + self.timeout if timed else math.inf

    def wait(self, request: MPI.Request, status: MPI.Status | None = None) -> None:
        """Return when ``request`` completes (filling ``status``); raise CollectiveTimeout past
        the deadline."""
        self._poll(lambda: bool(request.Test(status)))

    def waitall(self, requests: Sequence[MPI.Request]) -> None:
        """Return when all ``requests`` complete; raise CollectiveTimeout past the deadline."""
        pending = list(requests)
        self._poll(lambda: bool(MPI.Request.Testall(pending)))

    def _poll(self, done: Callable[[], bool]) -> None:
        for _ in range(_SPIN_TESTS):
            if done():
                return
        pause = _FIRST_SLEEP
        while time.monotonic() < self._deadline:
            if done():
                return
            time.sleep(pause)
            pause = min(pause * 2, _MAX_SLEEP)
        if done():
            return
        raise self.timeout_error()

    def timeout_error(self) -> CollectiveTimeout:
        """The error for the current collective's expired deadline: names the missing ranks
        and, as notes, what each of them is doing instead."""
        notes: list[str] = []
        if self._peer is not None:
            missing = [self._peer]
        else:
            missing, notes = self.diagnose(self.entered, self.kind)
        error = CollectiveTimeout(self.kind, self.entered, self.rank, self.timeout, missing)
        if hasattr(error, "add_note"):  # Python 3.11+: shown under the traceback
            for note in notes:
                error.add_note(note)
        return error

    def missing_ranks(self, seq: int) -> list[int]:
        """The ranks that never arrived at collective ``seq`` (see :meth:`diagnose`)."""
        return self.diagnose(seq, self.kind)[0]

    def diagnose(self, seq: int, kind: str) -> tuple[list[int], list[str]]:
        """Ask every other rank what it last entered. Missing: ranks behind ``seq``, in another
        collective, or silent. Also returns one line per missing rank saying which."""
        if not self.can_ask:
            return [], ["ranks cannot be asked: MPI was initialised without THREAD_MULTIPLE"]
        others = [r for r in range(self.size) if r != self.rank]
        replies = {r: np.zeros(_REPLY_BYTES, dtype=np.uint8) for r in others}
        query = np.array([seq], dtype=np.int64)
        recvs = {r: self._queries.Irecv(replies[r], source=r, tag=_REPLY_TAG) for r in others}
        sends = [self._queries.Isend(query, dest=r, tag=_QUERY_TAG) for r in others]
        deadline = time.monotonic() + min(2.0, max(0.5, self.timeout / 2))
        while time.monotonic() < deadline and not MPI.Request.Testall(list(recvs.values())):
            time.sleep(0.005)
        missing: list[int] = []
        notes: list[str] = []
        for r, req in recvs.items():
            if not req.Test():
                req.Cancel()
                missing.append(r)
                notes.append(f"rank {r}: no answer (dead, or stuck holding the interpreter)")
                continue
            their_seq, their_kind = _decode(replies[r])
            if their_seq < seq:
                missing.append(r)
                notes.append(f"rank {r}: still before this collective (last entered #{their_seq})")
            elif their_seq == seq and their_kind != kind:
                missing.append(r)
                notes.append(f"rank {r}: waiting in {their_kind} #{their_seq} instead")
        for req in sends:
            if not req.Test():
                req.Cancel()
        return missing, notes

    # -- the responder thread -----------------------------------------------------------------

    def _respond(self) -> None:
        incoming = np.zeros(1, dtype=np.int64)
        status = MPI.Status()
        request = self._queries.Irecv(incoming, source=MPI.ANY_SOURCE, tag=_QUERY_TAG)
        try:
            while not self._stop.is_set():
                if request.Test(status):
                    answer = _encode(*self._state)
                    self._queries.Send(answer, dest=status.Get_source(), tag=_REPLY_TAG)
                    request = self._queries.Irecv(incoming, source=MPI.ANY_SOURCE, tag=_QUERY_TAG)
                else:
                    self._stop.wait(_RESPONDER_SLEEP)
        finally:
            request.Cancel()
            request.Wait()

    def close(self) -> None:
        """Stop the responder and free the private communicator (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        _live.discard(self)
        if not MPI.Is_finalized():
            self._queries.Free()
