"""The finalize-fence hang, looped under load: how often does a job hang or crash its launcher?

    python bench/finalize_fence.py --runs 50            # with the exit barrier (the default)
    python bench/finalize_fence.py --runs 50 --no-barrier   # MNIFY_EXIT_BARRIER=0: as before

Each run is tests/runtime/test_communicators_failures.py's
``test_watchdog_point_to_point_names_the_silent_peer``: 3 ranks, rank 0 waits for a message
rank 2 never sends and times out (watchdog 2 s) while rank 1 has already finished its script.
Without the exit barrier rank 1 sits in ``MPI_Finalize``'s fence when rank 0 aborts, which
with Open MPI 5.0.11's PMIx deadlocks or crashes ``prterun`` now and then. One busy loop per
core runs throughout. A run that does not end within ``--timeout`` seconds is a hang (its whole
session is killed); a launcher that dies of a signal, or says so, is a crash.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testkit.ranks import run_ranks  # noqa: E402

SCRIPT = REPO / "tests" / "runtime" / "comm_scripts" / "failures.py"
EXPECTED = "collective recv #1 timed out after 2 s on rank 0: rank(s) 2 never arrived"
_CRASH = re.compile(r"prterun.*(?:signal 11|Segmentation fault)|Segmentation fault", re.I)


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--no-barrier", action="store_true")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy loops")
    args = parser.parse_args()
    env = {"MNIFY_WATCHDOG_TIMEOUT": "2"}
    if args.no_barrier:
        env["MNIFY_EXIT_BARRIER"] = "0"
    stop_at = time.monotonic() + args.runs * (args.timeout + 10)
    spinners = [multiprocessing.Process(target=_spin, args=(stop_at,)) for _ in range(args.load)]
    for s in spinners:
        s.start()
    counts = {"passed": 0, "hung": 0, "launcher_crash": 0, "other": 0}
    took: list[float] = []
    try:
        for i in range(args.runs):
            started = time.monotonic()
            run = run_ranks(3, SCRIPT, ["sleep_p2p"], env=env, timeout=args.timeout, check=False)
            took.append(time.monotonic() - started)
            if run.timed_out:
                outcome = "hung"
            elif run.returncode < 0 or _CRASH.search(run.output):
                outcome = "launcher_crash"
            elif run.returncode != 0 and EXPECTED in run.output:
                outcome = "passed"
            else:
                outcome = "other"
            counts[outcome] += 1
            print(f"run {i + 1}: {outcome} rc={run.returncode} {took[-1]:.1f} s", flush=True)
            if outcome in ("launcher_crash", "other"):
                print(run.describe()[-3000:], flush=True)
    finally:
        for s in spinners:
            s.terminate()
    print(
        f"runs={args.runs} barrier={'off' if args.no_barrier else 'on'} load={args.load} "
        + " ".join(f"{k}={v}" for k, v in counts.items())
        + f" seconds: min {min(took):.1f} median {sorted(took)[len(took) // 2]:.1f} "
        f"max {max(took):.1f}"
    )


if __name__ == "__main__":
    main()
