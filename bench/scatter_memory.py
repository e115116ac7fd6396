"""Peak memory of scatter_dataset on the receiving ranks: mnify's share-only sends vs ChainerMN.

ChainerMN pickles the whole dataset on the root and broadcasts it, so every rank holds all of it
(plus its pickle) at once, then keeps a SubDataset view of its part. mnify sends each rank only
the rows of its share. This launches one MPI job per implementation (peak RSS is per process
lifetime, so they cannot share a process) and prints, for the non-root ranks, the peak resident
set size (``ru_maxrss``) after the scatter and its growth over the same process just before it.

    .venv/bin/python bench/scatter_memory.py            # 2 ranks, ~200 MB TupleDataset
    .venv/bin/python bench/scatter_memory.py -n 3 --mb 400

Not a test: numbers depend on the machine; read the ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROW_FLOATS = 1000  # float32 features per example: 4 KB a row


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def worker(impl: str, megabytes: int) -> None:
    """One rank of one job: scatter a TupleDataset from rank 0, report memory as JSON on rank 0."""
    import chainer
    import numpy as np

    if impl == "chainermn":
        import chainermn

        comm: Any = chainermn.create_communicator("naive")
        scatter = chainermn.scatter_dataset
    else:
        from mnify import runtime as mn
        from mnify.runtime.datasets.scatter_dataset import scatter_dataset

        comm = mn.create_communicator("naive")
        scatter = scatter_dataset
    rows = megabytes * 1024 * 1024 // (4 * ROW_FLOATS)
    dataset = None
    if comm.rank == 0:
        x = np.random.RandomState(0).rand(rows, ROW_FLOATS).astype(np.float32)
        dataset = chainer.datasets.TupleDataset(x, np.arange(rows, dtype=np.int32))
    comm.mpi_comm.Barrier()
    before = peak_rss_mb()
    started = time.perf_counter()
    share = scatter(dataset, comm, shuffle=True, seed=0)
    seconds = time.perf_counter() - started
    checksum = float(
        sum(float(share[i][0][0]) for i in range(0, len(share), max(1, len(share) // 50)))
    )
    after = peak_rss_mb()
    stats = comm.mpi_comm.gather(
        {
            "rank": comm.rank,
            "before": before,
            "after": after,
            "n": len(share),
            "check": checksum,
            "seconds": seconds,
        },
        root=0,
    )
    if comm.rank == 0:
        print("RESULT " + json.dumps({"impl": impl, "rows": rows, "ranks": stats}), flush=True)


def launch(impl: str, n: int, megabytes: int) -> dict[str, Any]:
    from testkit.ranks import find_mpiexec, mpi_env

    cmd = [
        find_mpiexec(),
        "--oversubscribe",
        "-n",
        str(n),
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        impl,
        "--mb",
        str(megabytes),
    ]
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"{impl} run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--mb", type=int, default=200, help="dataset size in MB (default 200)")
    parser.add_argument("--worker", choices=["mnify", "chainermn"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.mb)
        return
    results = {impl: launch(impl, args.n, args.mb) for impl in ("chainermn", "mnify")}
    print(f"scatter_dataset of a {args.mb} MB TupleDataset on {args.n} ranks (shuffled)")
    print(
        f"{'impl':10} {'rank':>4} {'examples':>9} {'peak MB':>9} {'growth MB':>10} {'seconds':>8}"
    )
    growth: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for impl, result in results.items():
        for r in result["ranks"]:
            print(
                f"{impl:10} {r['rank']:>4} {r['n']:>9} {r['after']:>9.1f} "
                f"{r['after'] - r['before']:>10.1f} {r['seconds']:>8.2f}"
            )
        non_root = [r for r in result["ranks"] if r["rank"] != 0]
        growth[impl] = max(r["after"] - r["before"] for r in non_root)
        seconds[impl] = max(r["seconds"] for r in result["ranks"])
    if results["chainermn"]["ranks"][0]["check"] != results["mnify"]["ranks"][0]["check"]:
        print("warning: the two implementations gave rank 0 different examples")
    print(
        f"non-root peak growth: chainermn {growth['chainermn']:.1f} MB, "
        f"mnify {growth['mnify']:.1f} MB, ratio {growth['chainermn'] / max(growth['mnify'], 0.1):.1f}x"
    )
    print(
        f"slowest rank's scatter time: chainermn {seconds['chainermn']:.2f} s, "
        f"mnify {seconds['mnify']:.2f} s, ratio {seconds['chainermn'] / seconds['mnify']:.1f}x"
    )


if __name__ == "__main__":
    main()
