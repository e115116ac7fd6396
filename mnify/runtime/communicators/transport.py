"""MPI under the watchdog: how a communicator's bytes move.

Every public collective enters through :meth:`Transport._enter` (counts it, starts the watchdog's
deadline, runs the ``MNIFY_DEBUG`` signature check) and every MPI call runs through
:meth:`Transport._mpi` (blocking MPI when the watchdog is off; the non-blocking twin polled
against the deadline when it is on). On that sit the byte-level collectives and point-to-point
messages the array and object collectives are built from, so none of them calls MPI directly.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from mnify.runtime import debug, observers
from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators.wire import as_bytes, from_bytes, header_of, offsets
from mnify.runtime.debug import CallSignature
from mnify.runtime.errors import CollectiveMismatch
from mnify.runtime.watchdog import Watchdog

# what a point-to-point message carries (checked by the receiver)
_ARRAY = "array"
_OBJECT = "object"


class Transport:
    """The MPI side of :class:`~mnify.runtime.communicators.base.CommunicatorBase`."""

    # set by CommunicatorBase.__init__
    mpi_comm: MPI.Intracomm
    bucket_bytes: int
    _seq: int
    _debug: bool
    _watchdog: Watchdog | None
    _finalized: bool

    if TYPE_CHECKING:  # CommunicatorBase's topology

        @property
        def rank(self) -> int: ...

        @property
        def size(self) -> int: ...

    # -- plumbing: every collective enters here, every MPI call runs through _mpi ------------------

    def _enter(self, signature: CallSignature, *, timed: bool = True) -> None:
        """Count the collective, start its watchdog deadline (none if not ``timed``), check
        signatures in debug mode."""
        if self._finalized:
            raise RuntimeError(f"{signature.kind} on a finalized communicator")
        self._seq += 1
        if self._watchdog is not None:
            self._watchdog.start(signature.kind, self._seq, timed=timed)
        if self._debug:
            debug.check(signature, self._allgather_signatures)

    def _enter_p2p(self, kind: str, peer: int) -> None:
        """Point to point: not a collective, so neither counted nor signature-checked; the
        watchdog still bounds the wait and blames ``peer``."""
        if self._finalized:
            raise RuntimeError(f"{kind} on a finalized communicator")
        if self._watchdog is not None:
            self._watchdog.start(kind, self._seq, peer=peer)

    def _allgather_signatures(self, signature: CallSignature) -> list[CallSignature]:
        return [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(signature))]

    def _mpi(self, comm: MPI.Comm, method: str, *args: Any, **kwargs: Any) -> None:
        """``comm.<method>(...)``, or its non-blocking twin ``I<method>`` under the watchdog."""
        observers.wait_begins()
        try:
            if self._watchdog is None:
                getattr(comm, method)(*args, **kwargs)
            else:
                self._watchdog.wait(getattr(comm, "I" + method.lower())(*args, **kwargs))
        finally:
            observers.wait_ends()

    def _wait_all(self, requests: list[MPI.Request]) -> None:
        observers.wait_begins()
        try:
            if self._watchdog is None:
                MPI.Request.Waitall(requests)
            else:
                self._watchdog.waitall(requests)
        finally:
            observers.wait_ends()

    # -- byte-level collectives (no _enter: parts of a public collective) --------------------------

    def _allgather_bytes(self, payload: bytes | np.ndarray) -> list[bytes]:
        raw, counts, displs = self._allgather_raw(np.frombuffer(payload, dtype=np.uint8))
        return [raw[d : d + n].tobytes() for d, n in zip(displs, counts, strict=True)]

    def _allgather_raw(self, mine: np.ndarray) -> tuple[np.ndarray, list[int], list[int]]:
        sizes = np.empty(self.size, dtype=np.int64)
        self._mpi(self.mpi_comm, "Allgather", np.array([mine.size], dtype=np.int64), sizes)
        counts = [int(c) for c in sizes]
        displs = offsets(counts)
        raw = np.empty(sum(counts), dtype=np.uint8)
        self._mpi(self.mpi_comm, "Allgatherv", [mine, MPI.BYTE], [raw, (counts, displs), MPI.BYTE])
        return raw, counts, displs

    def _gather_raw(
        self, mine: np.ndarray, root: int
    ) -> tuple[np.ndarray, list[int], list[int]] | None:
        sizes = np.empty(self.size, dtype=np.int64) if self.rank == root else None
        self._mpi(self.mpi_comm, "Gather", np.array([mine.size], dtype=np.int64), sizes, root=root)
        if sizes is None:
            self._mpi(self.mpi_comm, "Gatherv", [mine, MPI.BYTE], None, root=root)
            return None
        counts = [int(c) for c in sizes]
        displs = offsets(counts)
        raw = np.empty(sum(counts), dtype=np.uint8)
        self._mpi(
            self.mpi_comm, "Gatherv", [mine, MPI.BYTE], [raw, (counts, displs), MPI.BYTE], root=root
        )
        return raw, counts, displs

    def _bcast_bytes(self, payload: bytes | None, root: int) -> bytes:
        size = np.array([len(payload) if payload is not None else 0], dtype=np.int64)
        self._mpi(self.mpi_comm, "Bcast", size, root=root)
        if self.rank == root:
            assert payload is not None
            raw = np.frombuffer(payload, dtype=np.uint8).copy()
        else:
            raw = np.empty(int(size[0]), dtype=np.uint8)
        self._mpi(self.mpi_comm, "Bcast", [raw, MPI.BYTE], root=root)
        return raw.tobytes()

    def _scatter_raw(self, parts: Sequence[np.ndarray] | None, root: int) -> np.ndarray:
        """Root's ``parts[r]`` (1-D uint8) arrive at rank r."""
        size = np.empty(1, dtype=np.int64)
        if self.rank == root:
            assert parts is not None
            counts = [int(p.size) for p in parts]
            self._mpi(self.mpi_comm, "Scatter", np.array(counts, dtype=np.int64), size, root=root)
            send = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)
            spec: Any = [send, (counts, offsets(counts)), MPI.BYTE]
        else:
            self._mpi(self.mpi_comm, "Scatter", None, size, root=root)
            spec = None
        out = np.empty(int(size[0]), dtype=np.uint8)
        self._mpi(self.mpi_comm, "Scatterv", spec, [out, MPI.BYTE], root=root)
        return out

    def _alltoall_raw(self, parts: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int], list[int]]:
        send_counts = [int(p.size) for p in parts]
        sizes = np.empty(self.size, dtype=np.int64)
        self._mpi(self.mpi_comm, "Alltoall", np.array(send_counts, dtype=np.int64), sizes)
        recv_counts = [int(c) for c in sizes]
        recv_displs = offsets(recv_counts)
        send = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)
        raw = np.empty(sum(recv_counts), dtype=np.uint8)
        self._mpi(
            self.mpi_comm,
            "Alltoallv",
            [send, (send_counts, offsets(send_counts)), MPI.BYTE],
            [raw, (recv_counts, recv_displs), MPI.BYTE],
        )
        return raw, recv_counts, recv_displs

    # -- one buffer, in bucket-sized pieces -------------------------------------------------------

    def _chunks(self, buf: np.ndarray) -> list[np.ndarray]:
        flat = buf.reshape(-1)
        step = max(1, self.bucket_bytes // max(1, flat.itemsize))
        return [flat[i : i + step] for i in range(0, flat.size, step)] or [flat]

    def _allreduce_bucket(self, send: np.ndarray, recv: np.ndarray, op: MPI.Op) -> None:
        """:meth:`_allreduce_into`, published to the observers as one bucket."""
        with observers.bucket(recv.nbytes):
            self._allreduce_into(send, recv, op)

    def _allreduce_into(self, send: np.ndarray, recv: np.ndarray, op: MPI.Op) -> None:
        """All-reduce the contiguous ``send`` into ``recv`` (the same array: in place), in
        bucket-sized pieces."""
        in_place = send is recv
        for s_piece, r_piece in zip(self._chunks(send), self._chunks(recv), strict=True):
            self._mpi(
                self.mpi_comm, "Allreduce", MPI.IN_PLACE if in_place else s_piece, r_piece, op
            )

    def _sync(self) -> None:
        """A barrier inside a collective (timed by the watchdog like the collective)."""
        self._mpi(self.mpi_comm, "Barrier")

    # -- point to point -----------------------------------------------------------------------------

    def _send_message(self, kind: str, header: Any, data: np.ndarray, dest: int, tag: int) -> None:
        head = np.frombuffer(pickle.dumps((kind, header)), dtype=np.uint8)
        size = np.array([head.size], dtype=np.int64)
        c = self.mpi_comm
        self._wait_all(
            [
                c.Isend(size, dest=dest, tag=tag),
                c.Isend([head, MPI.BYTE], dest=dest, tag=tag),
                c.Isend([data, MPI.BYTE], dest=dest, tag=tag),
            ]
        )

    def _recv_message(self, kind: str, source: int, tag: int) -> tuple[Any, np.ndarray]:
        size = np.empty(1, dtype=np.int64)
        status = MPI.Status()
        observers.wait_begins()
        try:
            if self._watchdog is None:
                self.mpi_comm.Recv(size, source=source, tag=tag, status=status)
            else:
                self._watchdog.wait(self.mpi_comm.Irecv(size, source=source, tag=tag), status)
        finally:
            observers.wait_ends()
        # the rest of the message comes from whoever sent the first part (ANY_SOURCE/ANY_TAG)
        source, tag = status.Get_source(), status.Get_tag()
        head = np.empty(int(size[0]), dtype=np.uint8)
        self._mpi(self.mpi_comm, "Recv", [head, MPI.BYTE], source=source, tag=tag)
        sent_kind, header = pickle.loads(head.tobytes())
        if sent_kind != kind:
            raise CollectiveMismatch(
                f"recv{'_obj' if kind == _OBJECT else ''}: rank {self.rank} expected "
                f"{'an object' if kind == _OBJECT else 'an array'} from rank {source} (tag {tag}) "
                f"but rank {source} sent {'an object' if sent_kind == _OBJECT else 'an array'}"
            )
        nbytes = (
            int(header)
            if kind == _OBJECT
            else int(np.prod(header[1], dtype=np.int64)) * np.dtype(header[0]).itemsize
        )
        data = np.empty(nbytes, dtype=np.uint8)
        self._mpi(self.mpi_comm, "Recv", [data, MPI.BYTE], source=source, tag=tag)
        return header, data

    @observers.point_to_point
    def send(self, x: Any, dest: int, tag: int = 0) -> None:
        host = arr.to_host(x)
        self._enter_p2p("send", dest)
        self._send_message(_ARRAY, header_of(host), as_bytes(host), dest, tag)

    @observers.point_to_point
    def recv(self, source: int, tag: int = 0) -> np.ndarray:
        """The array rank ``source`` sent with ``tag`` (as numpy; callers move it to a device)."""
        self._enter_p2p("recv", source)
        header, data = self._recv_message(_ARRAY, source, tag)
        return from_bytes(data, header)

    @observers.point_to_point
    def start_exchange(
        self,
        sends: Sequence[tuple[int, np.ndarray]],
        recvs: Sequence[tuple[int, np.ndarray]],
        tag: int = 0,
    ) -> list[MPI.Request]:
        """Post non-blocking sends of ``(dest, array)`` and receives into ``(source, buffer)``.

        Both sides know every shape (a halo's rows follow from the layer's geometry), so no
        header travels: the bytes go straight into the preallocated, contiguous numpy buffers.
        Hand the requests to :meth:`finish_exchange`; work done in between overlaps the
        transfer. Observers see the posting as one point-to-point call with peer -1 (several
        peers); the wait in :meth:`finish_exchange` is published as a wait.
        """
        peers = [p for p, _ in sends] + [p for p, _ in recvs]
        self._enter_p2p("exchange", peers[0] if peers else self.rank)
        c = self.mpi_comm
        requests = [c.Irecv([buf, MPI.BYTE], source=src, tag=tag) for src, buf in recvs]
        requests += [c.Isend([data, MPI.BYTE], dest=dst, tag=tag) for dst, data in sends]
        return requests

    def finish_exchange(self, requests: list[MPI.Request]) -> None:
        """Wait for the requests of :meth:`start_exchange` (under the watchdog's deadline)."""
        if requests:
            self._wait_all(requests)

    @observers.point_to_point
    def send_obj(self, obj: Any, dest: int, tag: int = 0) -> None:
        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        self._enter_p2p("send_obj", dest)
        self._send_message(_OBJECT, payload.size, payload, dest, tag)

    @observers.point_to_point
    def recv_obj(self, source: int, tag: int = 0) -> Any:
        self._enter_p2p("recv_obj", source)
        _, data = self._recv_message(_OBJECT, source, tag)
        return pickle.loads(data.tobytes())
