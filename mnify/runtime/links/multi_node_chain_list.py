"""Layer-wise model parallelism: a chain whose pieces live on different ranks.

Each rank builds its own ``MultiNodeChainList`` and ``add_link``s the pieces it runs, saying
where each piece's input comes from (``rank_in``: None for the model's input, or ranks to
receive from) and where its output goes (``rank_out``: None for the model's output, or ranks to
send to). Calling the chain runs the pieces in the order they were added, with ``send`` /
``recv`` between ranks.

Backward must reach every ``send`` (it receives the gradient the peer sends back), so the chain
threads each send's delegate variable into what comes next: into the next ``recv`` (preferred:
backward then runs this rank's sends and receives in exactly the reverse of their forward order,
which is what keeps two ranks that exchange in both directions from waiting on each other), else
into the next piece's inputs (``pseudo_connect``), or into the returned output. A rank that
produces no model output returns the last delegate; calling ``backward()`` on it drives that
rank's backward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import chainer

from mnify.runtime.functions.point_to_point_communication import recv, send
from mnify.runtime.functions.pseudo_connect import pseudo_connect

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

Ranks = int | Sequence[int] | None


def _as_ranks(ranks: Ranks) -> list[int] | None:
    if ranks is None:
        return None
    return [int(ranks)] if isinstance(ranks, int) else [int(r) for r in ranks]


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


class MultiNodeChainList(chainer.ChainList):
    """A ``ChainList`` whose pieces exchange inputs and outputs with other ranks.

    A two-stage MLP, the first half on rank 0 and the second (with the output) on rank 1::

        model = mn.links.MultiNodeChainList(comm)
        if comm.rank == 0:
            model.add_link(FirstHalf(), rank_in=None, rank_out=1)
        else:
            model.add_link(SecondHalf(), rank_in=0, rank_out=None)
        y = model(x)  # rank 1: the output; rank 0: a delegate variable
        loss = F.softmax_cross_entropy(y, t) if comm.rank == 1 else y
        loss.backward()  # on both ranks
    """

    def __init__(self, comm: CommunicatorBase) -> None:
        super().__init__()
        self._comm = comm
        self._routes: list[tuple[list[int] | None, list[int] | None]] = []

    @property
    def comm(self) -> CommunicatorBase:
        return self._comm

    def add_link(self, link: chainer.Link, rank_in: Ranks = None, rank_out: Ranks = None) -> None:
        """Add a piece: it reads from ``rank_in`` (None: the model input) and writes to
        ``rank_out`` (None: the model output; at most one piece may have that)."""
        ins, outs = _as_ranks(rank_in), _as_ranks(rank_out)
        if outs is None and any(o is None for _, o in self._routes):
            raise ValueError("only one piece of a MultiNodeChainList can produce the model output")
        super().add_link(link)
        self._routes.append((ins, outs))

    def forward(self, *inputs: Any) -> Any:
        """Run every piece in order; return the model output, or the last delegate variable."""
        rank = self._comm.rank
        delegate: chainer.Variable | None = None  # the last send not yet tied into the graph
        to_self: deque[tuple[Any, ...]] = deque()  # outputs this rank sends to itself
        output: tuple[Any, ...] | None = None

        for piece, (ins, outs) in zip(self._children, self._routes, strict=True):
            args: list[Any] = []
            if ins is None:
                args = list(inputs)
                if delegate is not None:
                    args = list(pseudo_connect(delegate, *args))
                    delegate = None
            else:
                for source in ins:
                    if source == rank:
                        args.extend(to_self.popleft())
                    else:
                        # The pending send's delegate goes into the recv: backward then runs
                        # this rank's communication in exactly the reverse of forward order.
                        got = recv(self._comm, source, delegate_variable=delegate)
                        delegate = None
                        args.extend(_as_tuple(got))
                if delegate is not None:  # only inputs sent to itself: tie the delegate to them
                    args = list(pseudo_connect(delegate, *args))
                    delegate = None
            y = piece(*args)

            if outs is None:
                output = _as_tuple(y)
                continue
            for dest in outs:
                if dest == rank:
                    to_self.append(_as_tuple(y))
                    continue
                if delegate is not None:  # two sends in a row: chain them so both are reached
                    y = pseudo_connect(delegate, *_as_tuple(y))
                delegate = send(y, self._comm, dest)

        if output is None:
            if delegate is None:
                raise RuntimeError(
                    f"rank {rank}: the MultiNodeChainList produced neither an output nor a send"
                )
            return delegate
        if delegate is not None:
            output = pseudo_connect(delegate, *output)
        return output[0] if len(output) == 1 else output
