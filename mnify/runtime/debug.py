"""``MNIFY_DEBUG=1``: ranks compare what they pass to each collective before running it.

Two ranks that enter different collectives, or the same one with different shapes, hang or
silently corrupt data. In debug mode a communicator first allgathers a
:class:`CallSignature` (kind, root, the dtypes and shapes of its arrays) and every rank checks
that all signatures agree; on a mismatch every rank raises the same
:class:`~mnify.runtime.errors.CollectiveMismatch`, naming ranks and what each passed::

    allreduce: rank 0 passed float32(4,3), rank 1 passed float32(5,3)

Shapes legitimately differ per rank for gather, allgather, alltoall and scatter: there only kind,
root and dtypes are compared. A non-root passing ``None`` to bcast/scatter has no arrays to
compare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mnify import environment
from mnify.runtime.errors import CollectiveMismatch, format_ranks

# kinds whose per-rank shapes may differ by contract
SHAPES_MAY_DIFFER = frozenset({"gather", "allgather", "alltoall", "scatter"})


def enabled() -> bool:
    return environment.DEBUG.read()


@dataclass(frozen=True)
class CallSignature:
    """What one rank passed to one collective (picklable, small)."""

    kind: str
    root: int | None = None
    op: str | None = None
    dtypes: tuple[str, ...] | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None
    names: tuple[str, ...] | None = field(default=None)

    @classmethod
    def of(
        cls,
        kind: str,
        arrays: Sequence[Any] | None,
        *,
        root: int | None = None,
        op: str | None = None,
        names: Sequence[str] | None = None,
    ) -> CallSignature:
        if arrays is None:
            return cls(kind, root, op, None, None, tuple(names) if names is not None else None)
        return cls(
            kind,
            root,
            op,
            tuple(str(a.dtype) for a in arrays),
            tuple(tuple(int(d) for d in a.shape) for a in arrays),
            tuple(names) if names is not None else None,
        )

    def comparable(self) -> tuple[Any, ...]:
        """The part that must agree across ranks."""
        shapes = None if self.kind in SHAPES_MAY_DIFFER else self.shapes
        return (self.kind, self.root, self.op, self.dtypes, shapes, self.names)

    def render(self) -> str:
        if self.dtypes is None or self.shapes is None:
            text = "no arrays"
        else:
            parts = [
                f"{d}({','.join(str(n) for n in s)})"
                for d, s in zip(self.dtypes, self.shapes, strict=True)
            ]
            text = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
            if self.names is not None:
                text = (
                    "["
                    + ", ".join(f"{n}: {p}" for n, p in zip(self.names, parts, strict=True))
                    + "]"
                )
        extras = []
        if self.root is not None:
            extras.append(f"root={self.root}")
        if self.op is not None:
            extras.append(f"op={self.op}")
        return text + (f" ({', '.join(extras)})" if extras else "")


def _grouped(signatures: Sequence[CallSignature], key: Callable[[CallSignature], Any]) -> str:
    groups: dict[Any, list[int]] = {}
    text: dict[Any, str] = {}
    for rank, sig in enumerate(signatures):
        k = key(sig)
        groups.setdefault(k, []).append(rank)
        text.setdefault(k, sig.render() if key is _comparable else sig.kind)
    parts = []
    for k, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"
        verb = " passed " if key is _comparable else " entered "
        parts.append(who + verb + text[k])
    return ", ".join(parts)


def _comparable(sig: CallSignature) -> Any:
    return sig.comparable()


def _kind(sig: CallSignature) -> Any:
    return sig.kind


def mismatch_message(signatures: Sequence[CallSignature]) -> str | None:
    """None when all ranks agree, else the error text naming ranks and what each passed."""
    if len({s.kind for s in signatures}) > 1:
        return "ranks entered different collectives: " + _grouped(signatures, _kind)
    if len({s.comparable() for s in signatures}) > 1:
        return f"{signatures[0].kind}: " + _grouped(signatures, _comparable)
    return None


def check(
    signature: CallSignature, allgather: Callable[[CallSignature], list[CallSignature]]
) -> None:
    """Allgather ``signature`` and raise CollectiveMismatch on every rank if any differ."""
    message = mismatch_message(allgather(signature))
    if message is not None:
        raise CollectiveMismatch(message)
