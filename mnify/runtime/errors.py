"""Errors the runtime raises instead of hanging or corrupting data.

The texts are a contract: ``mnify run`` recognises them in rank output to tell a communication
failure from an error in the user's code.
"""

from __future__ import annotations

from collections.abc import Sequence


def format_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``: compact rank lists for messages."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than ``MNIFY_WATCHDOG_TIMEOUT`` seconds.

    ``missing`` holds the ranks that never arrived at this collective (as far as the caller could
    learn: a rank that is dead or unreachable counts as missing).
    """

    def __init__(
        self, kind: str, seq: int, rank: int, timeout: float, missing: Sequence[int]
    ) -> None:
        self.kind = kind
        self.seq = seq
        self.rank = rank
        self.timeout = timeout
        self.missing = list(missing)
        who = format_ranks(self.missing) if self.missing else "unknown"
        super().__init__(
            f"collective {kind} #{seq} timed out after {timeout:g} s on rank {rank}: "
            f"rank(s) {who} never arrived"
        )


class CollectiveMismatch(RuntimeError):
    """``MNIFY_DEBUG=1``: ranks entered a collective with different kinds, shapes or dtypes."""
