#!/usr/bin/env bash
# The one prepared GPU check for mnify's CUDA kernels and the pure_nccl communicator, made to
# run in ONE call on a lent machine (one GPU, Python 3.12, CuPy 14 / CUDA 13, numpy 2, mpi4py,
# NCCL; no Chainer, no pytest, no package registry), from the repository root:
#   1. what is there (nvidia-smi, versions),
#   2. preconditions: mpi4py's MPI library loads, CuPy sees a device, NCCL's version, the type
#      of get_unique_id() (bytes from CuPy 14, a tuple before), whether ncclAvg exists,
#   3. raw one-rank NCCL calls through CuPy alone (allReduce fp32/fp16, ncclAvg, bcast,
#      allGather, a group of two), so a library problem is told apart from one of mnify's,
#   4. the gpu-marked tests -- pure_nccl at comm.size == 1 through every NCCL call, the pack,
#      unpack, scale, statistics and channel kernels, side streams and events, the overlap
#      scheduler with a main-communicator collective inside -- plus the CPU-side kernel checks,
#   5. bench/gpu.py (pack+unpack kernels vs device copy, host time apart; pure_nccl's mean vs
#      a raw NCCL all-reduce; BN statistics vs CuPy; channel gather),
#   6. bench/overlap_gpu.py: the overlap scheduler (buckets on a side stream, NCCL) on
#      ResNet-50-sized gradients behind a spin-kernel backward; the fraction hidden.
# Each step has a budget (STEP_BUDGET below); they sum below the script's cap (540 s, under the
# lent machine's 600 s per call), each step's limit is cut to what is left of the cap, and the
# summary ($OUT/summary.txt) is written however the script ends, with what stays unverified.
# `--dry-run` prints every step's plan and budget and checks that they fit; it needs no GPU.
#
# NCCL refuses two ranks on one GPU, so a one-GPU machine runs pure_nccl at comm.size == 1 only:
# multi-rank NCCL stays unverified (see the summary).
#
# Results go to $OUT (or ./gpu-check-out): env.txt, preconditions.txt, nccl-raw.txt,
# gpu-tests.log, gpu-junit.xml, bench.log, bench_gpu.json, overlap.log, bench_overlap_gpu.json,
# plan.json, summary.txt. Exit status: non-zero when a step failed. GPU_CHECK_STEPS="2 3" runs
# only those steps (tests run steps 1-3 and 6 on the CuPy stand-in).
#
# pytest + pytest-timeout for step 4: the GPU machine has neither and no registry. Prepare them
# HERE (a machine that reaches the registry), as pure-Python wheels unpacked into .gpu-pydeps/:
#   bash scripts/gpu_pydeps.sh
# then carry `.gpu-pydeps` with the call (a few MiB; this script adds it to PYTHONPATH when
# pytest is not importable). The per-test limit uses pytest-timeout's *thread* method: the
# signal method cannot interrupt a test stuck inside a CUDA or NCCL call.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-check-out}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# budgets in seconds; their sum plus the reserve for the summary must stay within the cap
CAP_S="${GPU_CHECK_BUDGET_S:-540}"
RESERVE_S=20
PER_TEST_S=60
STEP_NAMES=([1]="environment" [2]="preconditions" [3]="raw one-rank NCCL calls"
    [4]="gpu tests (pure_nccl at size 1, kernels, streams, overlap)" [5]="bench/gpu.py"
    [6]="bench/overlap_gpu.py")
STEP_BUDGET=([1]=15 [2]=45 [3]=60 [4]=220 [5]=110 [6]=60)
STEP_PLAN=(
    [1]="nvidia-smi --query-gpu=name,driver_version,memory.total; CUDA_VISIBLE_DEVICES"
    [2]="python: mpi4py library, cupy version, device count, CUDA runtime, nccl.available/get_version/unique id type/NCCL_AVG, nccl_status()"
    [3]="python: NcclCommunicator(1, uid, 0); allReduce f32/f16 sum, ncclAvg, bcast, allGather, group of two allReduces; mnify.join_nccl"
    [4]="python -m pytest -q --timeout $PER_TEST_S --timeout-method thread --junitxml gpu-junit.xml tests/gpu tests/kernels/test_kernels_device.py tests/kernels/test_kernels_host.py tests/kernels/test_kernel_plans.py tests/kernels/test_kernels_nvcc.py"
    [5]="python bench/gpu.py --json bench_gpu.json ${MNIFY_BENCH_ARGS:---repeat 10}"
    [6]="python bench/overlap_gpu.py --json bench_overlap_gpu.json ${MNIFY_OVERLAP_BENCH_ARGS:---repeat 5}"
)
UNVERIFIED="multi-rank NCCL (ncclCommInitRank across ranks and hosts, sums and ncclAvg over more
than one GPU, the overlap scheduler's buckets across ranks, the watchdog aborting a real NCCL
communicator, the duplicate-GPU refusal on real bus ids): one GPU and NCCL refuses two ranks
on it; those paths have run only on the CPU stand-in (tests/support/fakecupy)"

want() { [[ " ${GPU_CHECK_STEPS:-1 2 3 4 5 6} " == *" $1 "* ]]; }

plan_json() {
    local total=0 first=1
    printf '{"cap_s": %d, "reserve_s": %d, "steps": [' "$CAP_S" "$RESERVE_S"
    for i in 1 2 3 4 5 6; do
        want "$i" || continue
        total=$((total + STEP_BUDGET[i]))
        [ "$first" -eq 1 ] || printf ', '
        first=0
        printf '{"step": %d, "name": "%s", "budget_s": %d}' "$i" "${STEP_NAMES[i]}" "${STEP_BUDGET[i]}"
    done
    printf '], "total_s": %d, "fits": %s}\n' "$total" \
        "$([ $((total + RESERVE_S)) -le "$CAP_S" ] && echo true || echo false)"
}

if [ "${1:-}" = "--dry-run" ]; then
    total=0
    echo "gpu_check.sh dry run: cap ${CAP_S} s, reserve ${RESERVE_S} s for the summary"
    for i in 1 2 3 4 5 6; do
        want "$i" || continue
        total=$((total + STEP_BUDGET[i]))
        printf '  step %d  %-58s budget %3d s\n          %s\n' "$i" "${STEP_NAMES[i]}" \
            "${STEP_BUDGET[i]}" "${STEP_PLAN[i]}"
    done
    if "$py" -c "import pytest, pytest_timeout" 2>/dev/null; then
        deps="pytest and pytest-timeout importable"
    elif PYTHONPATH="$root/.gpu-pydeps:$PYTHONPATH" "$py" -c "import pytest, pytest_timeout" 2>/dev/null; then
        deps="pytest and pytest-timeout from .gpu-pydeps (carry it)"
    else
        deps="pytest/pytest-timeout MISSING: run scripts/gpu_pydeps.sh here, then carry .gpu-pydeps"
    fi
    echo "  step 4 needs: $deps"
    plan_json >"$out/plan.json"
    echo "  total ${total} s + reserve ${RESERVE_S} s = $((total + RESERVE_S)) s of ${CAP_S} s"
    echo "  unverified even when every step passes: $(echo $UNVERIFIED)"
    if [ $((total + RESERVE_S)) -le "$CAP_S" ]; then
        echo "DRY RUN OK: the budgets fit"
        exit 0
    fi
    echo "DRY RUN FAILED: the budgets exceed the cap"
    exit 1
fi

summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
failed=0
declare -A verdict=()
script_start=$SECONDS
budget_end=$((SECONDS + CAP_S - RESERVE_S))
# a step's limit: its budget, cut to what is left of the cap (at least 5 s)
limit() {
    local left=$((budget_end - SECONDS))
    [ "$left" -lt 5 ] && left=5
    echo $(($1 < left ? $1 : left))
}
finish() {
    {
        echo "== final summary ($(date -u +%FT%TZ), $((SECONDS - script_start)) s of ${CAP_S} s)"
        for i in 1 2 3 4 5 6; do
            want "$i" || continue
            echo "step $i ${STEP_NAMES[i]}: ${verdict[$i]:-not reached}"
        done
        echo "verified here only at comm.size == 1; UNVERIFIED: $(echo $UNVERIFIED)"
        [ "$failed" -eq 0 ] && echo "RESULT: all steps run passed" || echo "RESULT: FAILED"
    } >>"$summary"
}
trap finish EXIT
plan_json >"$out/plan.json"

if want 1; then
echo "== 1. environment"
{
    date -u
    timeout "$(limit "${STEP_BUDGET[1]}")" nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
} 2>&1 | tee "$out/env.txt"
verdict[1]="done"
fi

if want 2; then
echo "== 2. preconditions"
timeout -k 5 "$(limit "${STEP_BUDGET[2]}")" "$py" - <<'EOF' 2>&1 | tee "$out/preconditions.txt"
import sys

print("python", sys.version.split()[0])
bad = []


def step(name, fn):
    try:
        print(f"{name}: {fn()}")
    except Exception as exc:
        print(f"{name}: FAILED {type(exc).__name__}: {exc}")
        bad.append(name)


import numpy

print("numpy", numpy.__version__)
step("mpi4py MPI library", lambda: __import__("mpi4py.MPI").MPI.Get_library_version().splitlines()[0])
step("cupy", lambda: __import__("cupy").__version__)
step("CUDA devices visible", lambda: __import__("cupy").cuda.runtime.getDeviceCount())
step("CUDA runtime", lambda: __import__("cupy").cuda.runtime.runtimeGetVersion())


def nccl():
    from cupy.cuda import nccl as module

    return module


step("nccl.available", lambda: nccl().available)
step("nccl.get_version()", lambda: nccl().get_version())
step("type(nccl.get_unique_id())", lambda: type(nccl().get_unique_id()).__name__)
step("nccl.NCCL_AVG", lambda: getattr(nccl(), "NCCL_AVG", "missing (CuPy too old)"))
for name in ("chainer",):
    try:
        print(name, __import__(name).__version__)
    except Exception as exc:
        print(name, "missing:", type(exc).__name__)
from mnify.runtime.communicators.pure_nccl import nccl_status

print("nccl_status", nccl_status())
print("PRECONDITIONS", "FAILED: " + ", ".join(bad) if bad else "OK")
sys.exit(1 if bad else 0)
EOF
pre_rc=${PIPESTATUS[0]}
note "preconditions: exit $pre_rc; $(grep -a PRECONDITIONS "$out/preconditions.txt" || echo 'no verdict')"
verdict[2]="exit $pre_rc"
[ "$pre_rc" -eq 0 ] || failed=1
fi

if want 3; then
echo "== 3. raw one-rank NCCL calls (CuPy only)"
timeout -k 5 "$(limit "${STEP_BUDGET[3]}")" "$py" - <<'EOF' 2>&1 | tee "$out/nccl-raw.txt"
import sys

import cupy
import numpy as np
from cupy.cuda import nccl

results = []


def check(name, fn):
    try:
        fn()
        results.append(True)
        print("PASS", name)
    except Exception as exc:
        results.append(False)
        print("FAIL", name, f"{type(exc).__name__}: {exc}")


uid = nccl.get_unique_id()
print("unique id:", type(uid).__name__, len(uid))
comm = nccl.NcclCommunicator(1, uid, 0)  # the id exactly as this CuPy hands it out
stream = cupy.cuda.get_current_stream()
kinds = {np.float32: nccl.NCCL_FLOAT32, np.float16: nccl.NCCL_FLOAT16}


def allreduce(dtype, op):
    x = cupy.arange(1000, dtype=dtype)
    y = cupy.empty_like(x)
    comm.allReduce(x.data.ptr, y.data.ptr, x.size, kinds[dtype], op, stream.ptr)
    stream.synchronize()
    assert bool((x == y).all()), "one-rank all-reduce changed the data"


check("allReduce float32 sum", lambda: allreduce(np.float32, nccl.NCCL_SUM))
check("allReduce float16 sum", lambda: allreduce(np.float16, nccl.NCCL_SUM))
if hasattr(nccl, "NCCL_AVG") and nccl.get_version() >= 21000:
    check("allReduce float32 ncclAvg", lambda: allreduce(np.float32, nccl.NCCL_AVG))
else:
    print("SKIP ncclAvg: not in this CuPy/NCCL")


def bcast():
    x = cupy.arange(77, dtype=cupy.float32)
    comm.bcast(x.data.ptr, x.size, nccl.NCCL_FLOAT32, 0, stream.ptr)
    stream.synchronize()
    assert float(x[-1]) == 76.0


def allgather():
    x = cupy.arange(10, dtype=cupy.float32)
    y = cupy.zeros(10, dtype=cupy.float32)
    comm.allGather(x.data.ptr, y.data.ptr, x.size, nccl.NCCL_FLOAT32, stream.ptr)
    stream.synchronize()
    assert bool((x == y).all())


def group():
    xs = [cupy.full(5, i, cupy.float32) for i in range(2)]
    nccl.groupStart()
    for x in xs:
        comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    nccl.groupEnd()
    stream.synchronize()
    assert [float(x[0]) for x in xs] == [0.0, 1.0]


check("bcast", bcast)
check("allGather", allgather)
check("groupStart/groupEnd of two allReduces", group)


def via_mnify():
    from mnify.runtime.communicators.pure_nccl import join_nccl, unique_id_bytes

    other = join_nccl(nccl, cupy.__version__, 1, unique_id_bytes(nccl.get_unique_id()), 0)
    other.destroy()


check("mnify's join_nccl (id as bytes, in this CuPy's form)", via_mnify)
comm.destroy()
print("NCCL RAW", "OK" if all(results) else "FAILED")
sys.exit(0 if all(results) else 1)
EOF
raw_rc=${PIPESTATUS[0]}
note "raw NCCL: exit $raw_rc; $(grep -a 'NCCL RAW' "$out/nccl-raw.txt" || echo 'no verdict')"
verdict[3]="exit $raw_rc"
[ "$raw_rc" -eq 0 ] || failed=1
fi

if ! "$py" -c "import pytest" 2>/dev/null && [ -d "$root/.gpu-pydeps" ]; then
    export PYTHONPATH="$PYTHONPATH:$root/.gpu-pydeps"
fi
# the GPU tests, plus the CPU-side kernel checks (twins, launch geometry, nvcc/NVRTC where present);
# not the stand-in tests, which need mpiexec and prove nothing more on a GPU machine
tests=(tests/gpu tests/kernels/test_kernels_device.py tests/kernels/test_kernels_host.py
    tests/kernels/test_kernel_plans.py tests/kernels/test_kernels_nvcc.py)
if want 4; then
echo "== 4. tests (${tests[*]})"
if "$py" -c "import pytest" 2>/dev/null; then
    per_test=()
    if "$py" -c "import pytest_timeout" 2>/dev/null; then
        # the thread method: a test stuck inside a CUDA/NCCL call cannot take a signal
        per_test=(--timeout "$PER_TEST_S" --timeout-method thread)
    else
        note "WARNING: pytest-timeout missing: no per-test limit, only the step's ${STEP_BUDGET[4]} s"
    fi
    timeout -k 5 "$(limit "${STEP_BUDGET[4]}")" "$py" -m pytest -p no:cacheprovider -q -rs \
        ${per_test[@]+"${per_test[@]}"} --junitxml="$out/gpu-junit.xml" "${tests[@]}" 2>&1 |
        tee "$out/gpu-tests.log"
    tests_rc=${PIPESTATUS[0]}
    note "tests: exit $tests_rc; $(tail -n 1 "$out/gpu-tests.log")"
    if grep -q "no CUDA device/CuPy" "$out/gpu-tests.log"; then
        note "WARNING: gpu-marked tests were SKIPPED (no CuPy/device seen by the tests)"
        tests_rc=1
    fi
else
    note "tests: NOT RUN -- pytest missing (run scripts/gpu_pydeps.sh here and carry .gpu-pydeps)"
    tests_rc=1
fi
verdict[4]="exit $tests_rc"
[ "$tests_rc" -eq 0 ] || failed=1
fi

if want 5; then
echo "== 5. bench/gpu.py"
# shellcheck disable=SC2086 # MNIFY_BENCH_ARGS is a list of flags (e.g. --repeat 50)
timeout -k 5 "$(limit "${STEP_BUDGET[5]}")" "$py" bench/gpu.py --json "$out/bench_gpu.json" \
    ${MNIFY_BENCH_ARGS:---repeat 10} 2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}
note "bench: exit $bench_rc"
grep -E "goal|geometric|ratio" "$out/bench.log" >>"$summary" || true
verdict[5]="exit $bench_rc"
[ "$bench_rc" -eq 0 ] || failed=1
fi

if want 6; then
echo "== 6. bench/overlap_gpu.py"
# shellcheck disable=SC2086 # MNIFY_OVERLAP_BENCH_ARGS is a list of flags (e.g. --repeat 20)
timeout -k 5 "$(limit "${STEP_BUDGET[6]}")" "$py" bench/overlap_gpu.py \
    --json "$out/bench_overlap_gpu.json" ${MNIFY_OVERLAP_BENCH_ARGS:---repeat 5} 2>&1 |
    tee "$out/overlap.log"
overlap_rc=${PIPESTATUS[0]}
note "overlap bench: exit $overlap_rc"
grep -E "hidden fraction|backward:|reduce:|sequential:|overlap:" "$out/overlap.log" >>"$summary" || true
verdict[6]="exit $overlap_rc"
[ "$overlap_rc" -eq 0 ] || failed=1
fi

echo "== summary ($out)"
trap - EXIT
finish
cat "$summary"
[ "$failed" -eq 0 ]
