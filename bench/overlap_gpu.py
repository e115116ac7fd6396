"""GPU: how much of the gradient mean hides behind backward with the overlap scheduler.

Chainer-free (the GPU machine has CuPy, NCCL and mpi4py, no Chainer): ResNet-50-sized
gradients (161 float32 arrays, 25.5 M floats) on the ``pure_nccl`` communicator's GPU, and a
stand-in for backward -- a kernel spinning on the SM clock (bench/spin.cu, one block per SM;
no cuBLAS needed), then a kernel writing each gradient, the gradients produced in reverse
parameter order as backward produces them. The bucket
scheduler of :mod:`mnify.runtime.overlap` (buckets in that order, NCCL on a side stream) is
measured four ways, each as the median GPU time on the compute stream between two CUDA events:

- ``backward``: the stand-in alone;
- ``reduce``: every gradient handed to the scheduler at once, then ``wait`` (the mean alone);
- ``sequential``: backward, then the mean (what ``overlap=False`` does);
- ``overlap``: each gradient handed over as soon as backward wrote it (``overlap=True``).

``hidden = (backward + reduce - overlap) / reduce``: the fraction of the mean's time hidden
behind backward (1: all of it). On one rank NCCL's all-reduce is a device copy, so ``reduce``
is mostly packing and unpacking; with several GPUs run it under mpiexec, one rank per GPU.

Run: ``python bench/overlap_gpu.py [--json FILE] [--repeat N] [--backward-ms MS]
[--bucket-mib MIB]``; ``--smoke`` runs every path once on small arrays (tests use it on the
CuPy stand-in; its numbers mean nothing). With ``$OUT`` set the JSON also goes to
``$OUT/bench_overlap_gpu.json``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def resnet50_param_shapes() -> list[tuple[int, ...]]:
    """ResNet-50's parameter shapes in registration order: bench/gpu.py's (run from anywhere,
    as gpu_check.sh and the smoke test's runpy do, so its folder is put on the path)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu import resnet50_param_shapes as shapes

    return shapes()


def gpu_time(cupy: Any, fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``fn`` on the current stream between two CUDA events."""
    times = []
    for i in range(repeat + 1):
        start = cupy.cuda.Event()
        stop = cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if i:  # the first is a warm-up
            times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


SPIN_SOURCE = Path(__file__).resolve().with_name("spin.cu")


def spin_kernel(cupy: Any) -> Any:
    """bench/spin.cu's ``mnify_bench_spin(cycles, sink)``, compiled by CuPy (NVRTC)."""
    return cupy.RawKernel(SPIN_SOURCE.read_text(encoding="utf-8"), "mnify_bench_spin")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--backward-ms", type=float, default=30.0, help="stand-in backward")
    parser.add_argument("--bucket-mib", type=float, default=None, help="default: the plan's")
    parser.add_argument("--smoke", action="store_true", help="every path once, small arrays")
    args = parser.parse_args(argv)

    import cupy  # type: ignore[import-not-found]
    import numpy as np

    from mnify.runtime.communicators import create_communicator
    from mnify.runtime.overlap import BucketScheduler, OverlapChannel

    comm = create_communicator("pure_nccl")
    repeat = 1 if args.smoke else args.repeat
    shapes = resnet50_param_shapes()
    if args.smoke:
        shapes = [tuple(max(1, d // 16) for d in s) for s in shapes]
    order = list(reversed(range(len(shapes))))  # backward finishes the last layers first
    with comm._device:
        grads = [cupy.empty(shapes[i], dtype=cupy.float32) for i in order]
        spin = spin_kernel(cupy)
        sms = int(cupy.cuda.runtime.getDeviceProperties(comm.device_id)["multiProcessorCount"])
        sink = cupy.zeros(1, dtype=cupy.int32)
        probe = 1_000_000 if not args.smoke else 1000

        def spin_for(cycles: int) -> None:
            spin((sms,), (32,), (np.int64(cycles), sink))

        # calibrate: clock cycles per gradient so the stand-in backward takes --backward-ms
        one = gpu_time(cupy, lambda: spin_for(probe), 3 if not args.smoke else 1)
        cycles_per_s = probe / max(one, 1e-9)
        per_grad = max(1, int(args.backward_ms / 1e3 / len(grads) * cycles_per_s))
        if args.smoke:
            per_grad = 1000

        channel = OverlapChannel(comm, on_device=True)
        reducer = channel.reducer(np.dtype(np.float32))
        bucket_bytes = (
            int(args.bucket_mib * (1 << 20)) if args.bucket_mib else channel.bucket_bytes()
        )
        sched = BucketScheduler([int(g.size) for g in grads], reducer, bucket_bytes)

        def backward(hand_over: bool) -> None:
            for k, g in enumerate(grads):
                spin_for(per_grad)
                g.fill(1.0)
                if hand_over:
                    sched.ready(k, g)

        def never(i: int) -> Any:
            raise AssertionError(f"gradient {i} was never handed over")

        def run_backward() -> None:
            backward(False)

        def run_reduce() -> None:
            for k, g in enumerate(grads):
                sched.ready(k, g)
            sched.wait(never)

        def run_sequential() -> None:
            backward(False)
            run_reduce()

        def run_overlap() -> None:
            backward(True)
            sched.wait(never)

        host_start = time.perf_counter()
        results = {
            "backward": gpu_time(cupy, run_backward, repeat),
            "reduce": gpu_time(cupy, run_reduce, repeat),
            "sequential": gpu_time(cupy, run_sequential, repeat),
        }
        early = sched.started_early
        results["overlap"] = gpu_time(cupy, run_overlap, repeat)
        early = (sched.started_early - early) // (repeat + 1)  # per overlapped step
        host_s = time.perf_counter() - host_start
        channel.close()
    reduce_s = results["reduce"]
    hidden = (results["backward"] + reduce_s - results["overlap"]) / reduce_s if reduce_s else 0.0
    report = {
        "smoke": args.smoke,
        "ranks": comm.size,
        "arrays": len(grads),
        "params": int(sum(int(g.size) for g in grads)),
        "buckets": len(sched.buckets),
        "bucket_bytes": bucket_bytes,
        "spin_cycles_per_gradient": per_grad,
        "seconds": results,
        "hidden_fraction": hidden,
        "overlap_vs_sequential": results["overlap"] / results["sequential"],
        "buckets_started_during_backward": early,
        "host_s": host_s,
    }
    if comm.rank == 0:
        print(
            f"overlap bench: {comm.size} rank(s), {len(grads)} arrays, {report['params']} floats, "
            f"{len(sched.buckets)} buckets of <= {bucket_bytes >> 10} KiB"
        )
        for name, s in results.items():
            print(f"  {name:>10}: {s * 1e3:8.3f} ms")
        print(
            f"hidden fraction of the mean behind backward: {hidden:.2f}; "
            f"overlap / sequential {report['overlap_vs_sequential']:.3f}"
        )
        out_dir = os.environ.get("OUT")
        for path in [args.json, Path(out_dir) / "bench_overlap_gpu.json" if out_dir else None]:
            if path is not None:
                Path(path).write_text(json.dumps(report, indent=2) + "\n")
    comm.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
