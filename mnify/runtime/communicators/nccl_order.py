"""One order for every NCCL launch on a GPU, whichever communicator and stream queue it.

NCCL's kernels block until their peers arrive, so two NCCL operations that may run at the same
time on one GPU (two communicators -- the overlap scheduler's and the main one --, or one
communicator on two streams) can deadlock: each rank's GPU may be inside a different one.
NCCL's rule is to serialise them, in an order every rank issues alike. :class:`LaunchOrder`
does the first part on the device, without the host waiting: before a launch on a stream
other than the previous launch's, that stream waits on an event recorded after it. The second
part is the callers' contract: every rank queues its NCCL work in the same order (the overlap
scheduler starts buckets strictly in plan order; collectives inside backward follow the graph).

One order per device in the process (:func:`launch_order`), shared by every ``pure_nccl``
communicator and overlap channel on it.
"""

from __future__ import annotations

from typing import Any


class LaunchOrder:
    """Chains NCCL launches on one device with events (see the module doc)."""

    def __init__(self, cupy: Any) -> None:
        self._cupy = cupy
        self._last: Any = None  # the event after the latest launch
        self._last_stream = -1
        self._pending: dict[int, Any] = {}  # stream ptr -> event after its latest launch

    def before(self, stream: Any) -> None:
        """Make ``stream`` run after the previous NCCL launch on this device."""
        if self._last is not None and int(stream.ptr) != self._last_stream:
            stream.wait_event(self._last)

    def after(self, stream: Any) -> None:
        """Note a launch just queued on ``stream``."""
        event = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        self._last, self._last_stream = event, int(stream.ptr)
        self._pending[self._last_stream] = event

    def synchronize(self) -> None:
        """Host wait for every NCCL launch queued so far (before a communicator is destroyed)."""
        for event in self._pending.values():
            event.synchronize()
        self._pending.clear()


_orders: dict[int, LaunchOrder] = {}


def launch_order(cupy: Any, device_id: int) -> LaunchOrder:
    """The launch order of CUDA device ``device_id`` in this process."""
    order = _orders.get(device_id)
    if order is None:
        order = _orders[device_id] = LaunchOrder(cupy)
    return order
