"""The array and object collectives of the communicator contract.

Arrays travel as numpy on the host (CuPy staged through host memory). Arrays whose shapes may
differ per rank (gather, allgather, alltoall, scatter) travel as raw bytes after a small pickled
(dtype, shape) header -- never pickled themselves -- so float16 travels too. Reductions run in
the array's dtype when this MPI can reduce it, else in float32.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators.marks import collective
from mnify.runtime.communicators.transport import Transport
from mnify.runtime.communicators.wire import as_bytes, from_bytes, header_of
from mnify.runtime.debug import CallSignature


class Collectives(Transport):
    """``allreduce bcast gather allgather alltoall scatter``, their ``_obj`` twins, ``barrier``."""

    @collective
    def allreduce(self, x: Any, op: str = "sum") -> Any:
        """A new array: ``x`` reduced elementwise over ranks with ``op``."""
        host = arr.to_host(x)
        mpi_op = arr.mpi_op(op)
        self._enter(CallSignature.of("allreduce", [host], op=op))
        wire = arr.reduction_dtype(host.dtype)
        buf = np.array(host, dtype=wire, order="C", copy=True)
        self._allreduce_bucket(buf, buf, mpi_op)
        out = buf.astype(host.dtype, copy=False)
        return arr.like(out, x)

    # -- broadcasts -------------------------------------------------------------------------------

    @collective
    def bcast(self, x: Any, root: int = 0) -> Any:
        """Root's ``x`` on every rank (non-roots may pass None)."""
        self._enter(CallSignature("bcast", root=root))
        host = arr.to_host(x) if self.rank == root else None
        header = pickle.loads(
            self._bcast_bytes(pickle.dumps(header_of(host)) if host is not None else None, root)
        )
        dtype, shape = header
        if host is not None:
            raw = as_bytes(host).copy()
        else:
            raw = np.empty(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, np.uint8)
        for piece in self._chunks(raw):
            self._mpi(self.mpi_comm, "Bcast", [piece, MPI.BYTE], root=root)
        out = from_bytes(raw, header)
        return arr.like(out, x) if x is not None else out

    # -- gathers and scatters (shapes may differ per rank) ------------------------------------------

    @collective
    def gather(self, x: Any, root: int = 0) -> list[Any] | None:
        """Every rank's ``x`` as a list on root (None elsewhere); shapes may differ."""
        host = arr.to_host(x)
        self._enter(CallSignature.of("gather", [host], root=root))
        headers = self._gather_raw(np.frombuffer(pickle.dumps(header_of(host)), np.uint8), root)
        gathered = self._gather_raw(as_bytes(host), root)
        if headers is None or gathered is None:
            return None
        hraw, hcounts, hdispls = headers
        raw, counts, displs = gathered
        return [
            arr.like(from_bytes(raw[d : d + n], pickle.loads(hraw[hd : hd + hn].tobytes())), x)
            for d, n, hd, hn in zip(displs, counts, hdispls, hcounts, strict=True)
        ]

    @collective
    def allgather(self, x: Any) -> list[Any]:
        """Every rank's ``x`` as a list on every rank; shapes may differ."""
        host = arr.to_host(x)
        self._enter(CallSignature.of("allgather", [host]))
        headers = [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(header_of(host)))]
        raw, counts, displs = self._allgather_raw(as_bytes(host))
        return [
            arr.like(from_bytes(raw[d : d + n], h), x)
            for d, n, h in zip(displs, counts, headers, strict=True)
        ]

    @collective
    def alltoall(self, xs: Sequence[Any]) -> list[Any]:
        """Rank r sends ``xs[s]`` to rank s and gets back the list of what each rank sent it."""
        if len(xs) != self.size:
            raise ValueError(f"alltoall needs {self.size} arrays (one per rank), got {len(xs)}")
        hosts = [arr.to_host(x) for x in xs]
        self._enter(CallSignature.of("alltoall", hosts[:1]))
        hparts = [np.frombuffer(pickle.dumps(header_of(h)), np.uint8) for h in hosts]
        hraw, hcounts, hdispls = self._alltoall_raw(hparts)
        raw, counts, displs = self._alltoall_raw([as_bytes(h) for h in hosts])
        return [
            arr.like(from_bytes(raw[d : d + n], pickle.loads(hraw[hd : hd + hn].tobytes())), xs[0])
            for d, n, hd, hn in zip(displs, counts, hdispls, hcounts, strict=True)
        ]

    @collective
    def scatter(self, xs: Sequence[Any] | None, root: int = 0) -> Any:
        """Root's ``xs[r]`` arrives at rank r (non-roots pass None); shapes may differ."""
        hosts: list[np.ndarray] | None = None
        if self.rank == root:
            if xs is None or len(xs) != self.size:
                got = "None" if xs is None else f"{len(xs)} arrays"
                raise ValueError(f"scatter root needs {self.size} arrays (one per rank), got {got}")
            hosts = [arr.to_host(x) for x in xs]
        self._enter(CallSignature("scatter", root=root))
        hparts = (
            [np.frombuffer(pickle.dumps(header_of(h)), np.uint8) for h in hosts]
            if hosts is not None
            else None
        )
        header = pickle.loads(self._scatter_raw(hparts, root).tobytes())
        raw = self._scatter_raw([as_bytes(h) for h in hosts] if hosts is not None else None, root)
        out = from_bytes(raw, header)
        return arr.like(out, xs[0]) if xs is not None and self.rank == root else out

    # -- object collectives (pickled) ---------------------------------------------------------------

    @collective
    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        self._enter(CallSignature("bcast_obj", root=root))
        payload = pickle.dumps(obj) if self.rank == root else None
        raw = self._bcast_bytes(payload, root)
        return obj if self.rank == root else pickle.loads(raw)

    @collective
    def gather_obj(self, obj: Any, root: int = 0) -> list[Any] | None:
        self._enter(CallSignature("gather_obj", root=root))
        gathered = self._gather_raw(np.frombuffer(pickle.dumps(obj), np.uint8), root)
        if gathered is None:
            return None
        raw, counts, displs = gathered
        return [pickle.loads(raw[d : d + n].tobytes()) for d, n in zip(displs, counts, strict=True)]

    @collective
    def allgather_obj(self, obj: Any) -> list[Any]:
        self._enter(CallSignature("allgather_obj"))
        return [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(obj))]

    @collective
    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any:
        """``op`` over every rank's object, folded in rank order (the same result everywhere)."""
        arr.mpi_op(op)
        self._enter(CallSignature("allreduce_obj", op=op))
        values = [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(obj))]
        result = values[0]
        for v in values[1:]:
            if op == "sum":
                result = result + v
            elif op == "prod":
                result = result * v
            elif op == "max":
                result = max(result, v)
            else:
                result = min(result, v)
        return result

    @collective
    def scatter_obj(self, objs: Sequence[Any] | None, root: int = 0) -> Any:
        parts = None
        if self.rank == root:
            if objs is None or len(objs) != self.size:
                raise ValueError(f"scatter_obj root needs {self.size} objects (one per rank)")
            parts = [np.frombuffer(pickle.dumps(o), np.uint8) for o in objs]
        self._enter(CallSignature("scatter_obj", root=root))
        return pickle.loads(self._scatter_raw(parts, root).tobytes())

    # -- synchronisation -------------------------------------------------------------------------

    @collective
    def barrier(self) -> None:
        """Wait for every rank. Never timed by the watchdog: it is the explicit synchronisation
        point to put before timed collectives when ranks legitimately drift apart (rank 0
        evaluating while the others wait)."""
        self._enter(CallSignature("barrier"), timed=False)
        self._mpi(self.mpi_comm, "Barrier")
