"""The runtime on ranks spread over several real hosts (the test bed), not faked host names.

One launch per layout runs topology, gradient averaging of every CPU communicator and
scatter_dataset (``scripts/across_hosts.py``); the Chainer layer's rank scripts (parity, MNBN,
evaluator, datasets, checkpointer) then run unchanged on the hierarchical communicator across
hosts, and the communicator engineer's collective checks run on real hosts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.testbed import TestBed
from tests.support.mpirun import RankRun
from tests.support.rank_checks import missing

SCRIPTS = Path(__file__).resolve().parent / "scripts"
RUNTIME_TESTS = Path(__file__).resolve().parents[1] / "runtime"


def results(run: RankRun, n: int) -> list[dict[str, object]]:
    found: dict[int, dict[str, object]] = {}
    for r in range(n):
        for line in run.rank_lines(r):
            if line.startswith("RESULT "):
                found[r] = json.loads(line[len("RESULT ") :])
    assert sorted(found) == list(range(n)), f"missing RESULT lines\n{run.describe()}"
    return [found[r] for r in range(n)]


LAYOUTS = {
    # hostfile slots, extra mpiexec flags, each rank's host, its
    # [intra_rank, intra_size, inter_rank, inter_size]
    "2x2": (
        [2, 2],
        [],
        ["mna", "mna", "mnb", "mnb"],
        [[0, 2, 0, 2], [1, 2, 0, 2], [0, 2, 1, 2], [1, 2, 1, 2]],
    ),
    "slots-2-1-1": (
        [2, 1, 1],
        [],
        ["mna", "mna", "mnb", "mnc"],
        [[0, 2, 0, 3], [1, 2, 0, 3], [0, 1, 1, 3], [0, 1, 2, 3]],
    ),
    "slots-2-1": ([2, 1], [], ["mna", "mna", "mnb"], [[0, 2, 0, 2], [1, 2, 0, 2], [0, 1, 1, 2]]),
    # Round-robin placement: a host's ranks are not contiguous (0 and 2 share mna).
    "2x2-map-by-node": (
        [2, 2],
        ["--map-by", "node"],
        ["mna", "mnb", "mna", "mnb"],
        [[0, 2, 0, 2], [0, 2, 1, 2], [1, 2, 0, 2], [1, 2, 1, 2]],
    ),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_topology_averaging_and_scatter_across_hosts(bed3: TestBed, layout: str) -> None:
    slots, flags, hosts, topology = LAYOUTS[layout]
    n = sum(slots)
    run = bed3.run(slots, SCRIPTS / "across_hosts.py", timeout=120, mpiexec_args=flags)
    seen = results(run, n)
    assert [r["processor"] for r in seen] == hosts
    for name in ("hierarchical", "two_dimensional", "flat", "naive"):
        assert [r[name] for r in seen] == topology, name
    # Several hosts and a host with several ranks: on CPU auto picks two_dimensional where
    # every host runs as many ranks, hierarchical where they differ.
    even = len(set(slots)) == 1
    assert {r["auto"] for r in seen} == {"two_dimensional" if even else "hierarchical"}
    shares = [tuple(r["scatter"]) for r in seen]  # type: ignore[arg-type]
    assert len(set(shares)) == n  # each rank its own share


@pytest.mark.parametrize(
    ("slots", "flags"),
    [([2, 2], []), ([2, 2], ["--map-by", "node"]), ([2, 2, 2], []), ([2, 1, 1], [])],
    ids=["2x2", "2x2-map-by-node", "3x2", "slots-2-1-1"],
)
def test_two_dimensional_mean_is_exact_and_identical_across_hosts(
    bed3: TestBed, slots: list[int], flags: list[str]
) -> None:
    """The pipelined two-dimensional mean (reduce-scatter in the host, shares across hosts --
    swapped between two hosts, all-reduced among three -- all-gather in the host) equals a
    float64 reference and is bit-identical on every rank of every host, for several bucket
    sizes, windows and dtypes, twice in a row; on uneven hosts it is hierarchical's scheme."""
    n = sum(slots)
    run = bed3.run(slots, SCRIPTS / "two_dimensional.py", timeout=240, mpiexec_args=flags)
    seen = results(run, n)
    for r in range(n):
        assert "PASS two_dimensional" in run.rank_lines(r), run.describe()
    even = len(set(slots)) == 1
    assert all(all(c == even for c in s["columns"]) for s in seen), seen  # type: ignore[attr-defined]
    assert {s["auto"] for s in seen} == {"two_dimensional" if even else "hierarchical"}


CHAINER_SCRIPTS = [
    ("parity_checks.py", [2, 2]),
    ("mnbn_checks.py", [2, 2]),
    ("evaluator_checks.py", [2, 1, 1]),
    ("dataset_checks.py", [2, 1, 1]),
    ("checkpoint_checks.py", [2, 1, 1]),
]


@pytest.mark.parametrize(
    ("script", "slots"), CHAINER_SCRIPTS, ids=[s.split("_")[0] for s, _ in CHAINER_SCRIPTS]
)
def test_chainer_layer_on_hierarchical_across_hosts(
    bed3: TestBed, script: str, slots: list[int]
) -> None:
    """The Chainer engineer's rank scripts, unchanged, on the hierarchical communicator with
    ranks on real hosts: data-parallel training equals one process on the whole batch (the
    first broadcast, gradients and batch-norm statistics crossing host links), the evaluator's
    weighted means, scatter_dataset's shares and the checkpointer agree with one host."""
    path = RUNTIME_TESTS / "chainer_scripts" / script
    checks = _checks_of(path)
    run = bed3.run(slots, path, env={"MNIFY_TEST_COMM": "hierarchical"}, timeout=240)
    for r in range(sum(slots)):
        not_passed = missing(run.rank_lines(r), checks)
        assert not not_passed, f"rank {r}: {not_passed}\n{run.describe()}"


def _checks_of(script: Path) -> list[str]:
    """The check names a rank script reports, as its own single-host test expects them."""
    from tests.runtime import (
        test_datasets,
        test_evaluator,
        test_mnbn,
        test_optimizer_checkpoint,
        test_parity,
    )

    expected = {
        "parity_checks.py": test_parity.CHECKS,
        "mnbn_checks.py": test_mnbn.CHECKS,
        "evaluator_checks.py": test_evaluator.CHECKS,
        "dataset_checks.py": test_datasets.CHECKS,
        "checkpoint_checks.py": test_optimizer_checkpoint.CHECKS,
    }
    return list(expected[script.name])


def test_every_collective_on_real_hosts(bed3: TestBed) -> None:
    """The communicator engineer's collective checks, hosts from the kernel instead of faked."""
    names = ["hierarchical", "flat", "auto"]
    run = bed3.run([2, 1, 1], RUNTIME_TESTS / "comm_scripts" / "collectives.py", names, timeout=180)
    for r in range(4):
        lines = run.rank_lines(r)
        not_passed = missing(lines, names)
        assert not not_passed, f"rank {r} did not finish {not_passed}\n{run.describe()}"
        assert "CLASS auto hierarchical" in lines, run.describe()


def test_every_collective_on_two_dimensional_across_hosts(bed3: TestBed) -> None:
    """The same collective checks on two hosts of two ranks, where auto is two_dimensional:
    default and 64-byte buckets, under MNIFY_DEBUG's signature checks and the watchdog."""
    names = ["two_dimensional", "two_dimensional/small", "auto"]
    env = {"MNIFY_DEBUG": "1", "MNIFY_WATCHDOG_TIMEOUT": "60"}
    run = bed3.run(
        [2, 2], RUNTIME_TESTS / "comm_scripts" / "collectives.py", names, env=env, timeout=240
    )
    for r in range(4):
        lines = run.rank_lines(r)
        not_passed = missing(lines, names)
        assert not not_passed, f"rank {r} did not finish {not_passed}\n{run.describe()}"
        assert "CLASS auto two_dimensional" in lines, run.describe()


@pytest.mark.parametrize("slots", [[2, 2], [2, 2, 2]], ids=["2x2", "3x2"])
def test_float16_between_real_hosts(bed3: TestBed, slots: list[int]) -> None:
    """``inter_host_dtype=float16`` over real TCP links: the faked-host checks (exact model on
    two hosts, identical bits, float16 rounding bounds, the warning of flat) hold unchanged."""
    checks = ["narrow-across-hosts", "float16-gradients-unchanged", "flat-warns-full-precision"]
    script = RUNTIME_TESTS / "comm_scripts" / "inter_host_compression.py"
    run = bed3.run(slots, script, timeout=240)
    for r in range(sum(slots)):
        not_passed = missing(run.rank_lines(r), checks)
        assert not not_passed, f"rank {r} did not finish {not_passed}\n{run.describe()}"
