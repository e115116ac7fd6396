"""Every ``MNIFY_*`` environment variable mnify reads: one table, one parser.

Beside ``[tool.mnify]`` (:mod:`mnify.config`, the converter's settings) the environment is the
other place settings come from, and the only one that reaches the ranks of a job. The ranks'
runtime and the launcher read it here and nowhere else (``tests/environment`` scans the package
for other readers). Each :class:`Variable` in :data:`VARIABLES` holds its name, type, default,
who sets it and what it means; docs/environment.md's table is generated from it
(``python -m mnify.environment docs/environment.md``).

Who sets a variable (:data:`SetBy`):

- ``user``: a switch people set (docs/design.md §3, docs/*.md); some ``mnify run`` options set
  the same switch for every rank (``--watchdog``, ``--timeline``, ``--verify``);
- ``tuning``: a knob for experiments, tests and benchmarks (timeouts, a reduction path);
- ``launcher``: ``MNIFY_LAUNCH``, the one variable ``mnify run`` and ``mnify scale`` use to tell
  their ranks what only they know (:class:`LaunchWiring`).

Values are read when asked for, never cached: rank scripts and tests set a variable in
``os.environ`` before they create a communicator. Surrounding blanks are ignored and an empty
value means unset. A value that does not parse raises :class:`BadValue`, naming the variable.

Standard library only: every rank imports this before the script runs (no Chainer, click or
libcst).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")

SetBy = Literal["user", "tuning", "launcher"]


class BadValue(ValueError):
    """An ``MNIFY_*`` variable set to something its type does not allow."""


@dataclass(frozen=True)
class Kind(Generic[T_co]):
    """A variable's type: its name in the docs, what a value must look like, and the conversion
    (which raises ValueError for a bad value)."""

    label: str
    expected: str
    convert: Callable[[str], T_co]


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _to_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(text)


def _to_switch(text: str) -> bool | None:
    return None if text.lower() == "auto" else _to_bool(text)


def _to_seconds(text: str) -> float:
    value = float(text)
    if math.isnan(value):
        raise ValueError(text)
    return value


def _to_launch(text: str) -> LaunchWiring:
    return LaunchWiring.from_text(text)


BOOL: Kind[bool] = Kind("bool", "1 or 0 (true/false, yes/no, on/off)", _to_bool)
SWITCH: Kind[bool | None] = Kind(
    "1/0/auto", "1, 0 or auto (true/false, yes/no, on/off)", _to_switch
)
INT: Kind[int] = Kind("int", "a whole number", int)
SECONDS: Kind[float] = Kind("seconds", "a number of seconds", _to_seconds)
STR: Kind[str] = Kind("str", "a name", str)
PATH: Kind[str] = Kind("path", "a path", str)
LAUNCH_JSON: Kind[LaunchWiring] = Kind("JSON", "a JSON object written by mnify run", _to_launch)


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One ``MNIFY_*`` variable. ``forwarded``: ``mnify run`` passes the caller's value on to
    every rank (False for per-host and launcher-side values, and for ``MNIFY_LAUNCH``, which
    the launcher writes itself)."""

    name: str
    kind: Kind[T]
    default: T
    set_by: SetBy
    meaning: str
    forwarded: bool = True

    def raw(self, environ: Mapping[str, str] | None = None) -> str:
        """The value as set, without surrounding blanks; "" when unset."""
        return (os.environ if environ is None else environ).get(self.name, "").strip()

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return bool(self.raw(environ))

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """The value (the default when unset); :class:`BadValue` when it does not parse."""
        text = self.raw(environ)
        if not text:
            return self.default
        try:
            return self.kind.convert(text)
        except ValueError as exc:
            detail = f" ({exc})" if isinstance(exc, BadValue) else ""
            raise BadValue(
                f"{self.name} must be {self.kind.expected}, got {text!r}{detail}"
            ) from None

    def read_or_default(self, environ: Mapping[str, str] | None = None) -> T:
        """The value, or the default with a line on stderr when it does not parse: for readers
        on the way out of a failing rank, which must not fail themselves."""
        try:
            return self.read(environ)
        except BadValue as exc:
            sys.stderr.write(f"mnify: {exc}; using {self.default!r}\n")
            return self.default


# the smallest value each numeric key of MNIFY_LAUNCH takes
_LEAST: dict[str, int] = {"scale_updates": 1, "timeline_events": 16, "verify_timeout": 1}


@dataclass(frozen=True)
class LaunchWiring:
    """What ``mnify run`` and ``mnify scale`` tell their ranks, as ``MNIFY_LAUNCH`` (JSON).

    - ``rank_state_dir``/``rank_state_host``: where and on which host the ranks publish their
      state for the launcher (:mod:`mnify.runtime.rank_state`); ranks on other hosts publish
      nothing;
    - ``verify_report``: under ``--verify`` rank 0 prints its report as one JSON line for the
      launcher to render, and the ranks leave the exit status to it (docs/verify.md);
    - ``scale_updates``: ``mnify scale`` runs the script with its probes and stops every rank
      after this update (:mod:`mnify.runtime.scale_probe`, docs/scale.md);
    - ``timeline_events``: ``mnify run --timeline-events``, the events each rank's timeline
      keeps (docs/timeline.md);
    - ``verify_timeout``: ``mnify run --verify-timeout``, the seconds rank 0 waits at the
      verification stop for a rank (docs/verify.md);
    - ``write_net_report``: rank 0 prints the write net's findings as one JSON line for the
      launcher to render and put in ``--summary-json`` (docs/write_net.md);
    - ``phase_stop``/``phase_snapshot``/``phase_resume``: ``mnify run --grow-ranks``, the
      milestone this phase stops at (``30e``, ``500i``), the global snapshot it writes there, the
      one it resumes from (:mod:`mnify.runtime.phases`, docs/global_batch.md).
    """

    rank_state_dir: str | None = None
    rank_state_host: str | None = None
    verify_report: bool = False
    scale_updates: int | None = None
    timeline_events: int | None = None
    verify_timeout: float | None = None
    write_net_report: bool = False
    phase_stop: str | None = None
    phase_snapshot: str | None = None
    phase_resume: str | None = None

    def to_text(self) -> str:
        """The JSON the launcher sets: only the fields that are set, in a fixed order."""
        fields = dataclasses.asdict(self)
        return json.dumps({k: v for k, v in fields.items() if v not in (None, False)})

    @classmethod
    def from_text(cls, text: str) -> LaunchWiring:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadValue(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadValue("not a JSON object")
        types: dict[str, type] = {
            "rank_state_dir": str, "rank_state_host": str, "verify_report": bool,
            "scale_updates": int, "timeline_events": int, "verify_timeout": float,
            "write_net_report": bool, "phase_stop": str, "phase_snapshot": str,
            "phase_resume": str,
        }  # fmt: skip
        for key, value in data.items():
            if key not in types:
                raise BadValue(f"unknown key {key!r}")
            wanted = types[key]
            # bool is an int in Python, not in JSON: true is no number; 120 is a float of seconds
            kinds = (int, float) if wanted is float else (wanted,)
            if not isinstance(value, kinds) or (wanted is not bool and isinstance(value, bool)):
                raise BadValue(f"{key} must be {wanted.__name__}, got {value!r}")
            least = _LEAST.get(key)
            if least is not None and isinstance(value, (int, float)) and value < least:
                raise BadValue(f"{key} must be {least} or more, got {value}")
        return cls(**data)


# -- the table ---------------------------------------------------------------------------------

DEBUG = Variable(
    "MNIFY_DEBUG", BOOL, False, "user",
    "Before each collective the ranks compare its kind, shapes and dtypes: a mismatch is an "
    "error naming the ranks (docs/multinode.md).",
)  # fmt: skip
WATCHDOG_TIMEOUT: Variable[float | None] = Variable(
    "MNIFY_WATCHDOG_TIMEOUT", SECONDS, None, "user",
    "A collective waiting longer raises CollectiveTimeout naming the ranks that never came; "
    "unset or <= 0: no watchdog. `mnify run --watchdog` sets it.",
)  # fmt: skip
TIMELINE: Variable[str | None] = Variable(
    "MNIFY_TIMELINE", PATH, None, "user",
    "Every rank records its collectives in DIR/rank-R.timeline (docs/timeline.md). "
    "`mnify run --timeline` and `mnify scale` set it.",
)  # fmt: skip
VERIFY = Variable(
    "MNIFY_VERIFY", INT, 0, "user",
    "Check the first K updates for data parallelism, then stop (docs/verify.md); 0: off. "
    "`mnify run --verify` sets it.",
)  # fmt: skip
WRITE_NET = Variable(
    "MNIFY_WRITE_NET", BOOL, True, "user",
    "Every rank records the files it writes; at a normal exit rank 0 names each file two ranks "
    "wrote, or a rank other than 0 wrote beside rank 0's files (docs/write_net.md); 0: off.",
)  # fmt: skip
MPIEXEC: Variable[str | None] = Variable(
    "MNIFY_MPIEXEC", PATH, None, "user",
    "The mpiexec `mnify run`, `mnify scale` and `mnify doctor` use (before the one beside "
    "Python, then PATH). Read by the launcher only.",
    forwarded=False,
)  # fmt: skip
HOSTNAME: Variable[str | None] = Variable(
    "MNIFY_HOSTNAME", STR, None, "user",
    "The host name ranks are grouped into hosts by, instead of MPI's processor name (tests "
    "fake several hosts on one machine). Per host: never forwarded.",
    forwarded=False,
)  # fmt: skip
EXIT_BARRIER = Variable(
    "MNIFY_EXIT_BARRIER", SECONDS, 60.0, "tuning",
    "Seconds a rank leaving normally waits for the others before MPI_Finalize; 0: no wait "
    "(docs/fault-tolerance.md).",
)  # fmt: skip
ABORT_GRACE = Variable(
    "MNIFY_ABORT_GRACE", SECONDS, 1.0, "tuning",
    "Seconds a failing rank waits under `mnify run` before aborting the job, so ranks failing "
    "alike all print their tracebacks.",
)  # fmt: skip
ABORT_FALLBACK = Variable(
    "MNIFY_ABORT_FALLBACK", SECONDS, 5.0, "tuning",
    "Seconds (at least 0.5) after which a rank whose MPI_Abort hangs leaves anyway.",
)  # fmt: skip
SHARED_MEMORY = Variable(
    "MNIFY_SHARED_MEMORY", BOOL, True, "tuning",
    "On one host `flat` and `hierarchical` average through a /dev/shm segment; 0: over MPI.",
)  # fmt: skip
SINGLE_COPY = Variable(
    "MNIFY_SINGLE_COPY", SWITCH, None, "tuning",
    "`flat` on one host: 1 always averages by single copy, 0 never; unset or auto: it times "
    "both and keeps the faster.",
)  # fmt: skip
OVERLAP = Variable(
    "MNIFY_OVERLAP", SWITCH, None, "tuning",
    "What create_multi_node_optimizer(overlap=None) means: 1 overlap the averaging with "
    "backward, 0 not; unset or auto: on for pure_nccl only.",
)  # fmt: skip
LAUNCH = Variable(
    "MNIFY_LAUNCH", LAUNCH_JSON, LaunchWiring(), "launcher",
    "What `mnify run` and `mnify scale` tell their ranks (rank state directory and host, "
    "verify and write net reports, scale updates); written by the launcher only.",
    forwarded=False,
)  # fmt: skip

VARIABLES: tuple[Variable[Any], ...] = (
    DEBUG, WATCHDOG_TIMEOUT, TIMELINE, VERIFY, WRITE_NET, MPIEXEC, HOSTNAME,
    EXIT_BARRIER, ABORT_GRACE, ABORT_FALLBACK,
    SHARED_MEMORY, SINGLE_COPY, OVERLAP,
    LAUNCH,
)  # fmt: skip

NOT_FORWARDED: tuple[str, ...] = tuple(v.name for v in VARIABLES if not v.forwarded)


def bad_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """What is wrong with the variables set (one message each; ``MNIFY_LAUNCH`` aside, which
    the launcher writes itself): ``mnify run`` says it before starting a rank that would stop."""
    found = []
    for variable in VARIABLES:
        if variable.set_by == "launcher":
            continue
        try:
            variable.read(environ)
        except BadValue as exc:
            found.append(str(exc))
    return found


# -- the docs' table ---------------------------------------------------------------------------

TABLE_BEGIN = (
    "<!-- the table below is generated: python -m mnify.environment docs/environment.md -->"
)
TABLE_END = "<!-- end of the generated table -->"


def _default_text(variable: Variable[Any]) -> str:
    value = variable.default
    if value is None or isinstance(value, LaunchWiring):
        return "unset"
    if isinstance(value, bool):
        return "1" if value else "0"
    return f"{value:g}" if isinstance(value, float) else str(value)


def table_markdown() -> str:
    """The Markdown table of :data:`VARIABLES` (docs/environment.md's generated part)."""
    lines = [
        "| variable | type | default | set by | meaning |",
        "|---|---|---|---|---|",
    ]
    for v in VARIABLES:
        lines.append(
            f"| `{v.name}` | {v.kind.label} | {_default_text(v)} | {v.set_by} | {v.meaning} |"
        )
    return "\n".join(lines) + "\n"


def with_current_table(document: str) -> str:
    """``document`` with the text between :data:`TABLE_BEGIN` and :data:`TABLE_END` replaced by
    :func:`table_markdown`."""
    head, begin, rest = document.partition(TABLE_BEGIN + "\n")
    _, end, tail = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"the document has no {TABLE_BEGIN!r} ... {TABLE_END!r} section")
    return head + begin + table_markdown() + end + tail


def main(argv: list[str]) -> int:
    """``python -m mnify.environment [FILE]``: print the table, or rewrite FILE's table."""
    if not argv:
        sys.stdout.write(table_markdown())
        return 0
    with open(argv[0], encoding="utf-8") as f:
        document = f.read()
    with open(argv[0], "w", encoding="utf-8") as f:
        f.write(with_current_table(document))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
