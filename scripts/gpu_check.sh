#!/usr/bin/env bash
# The one prepared GPU check for mnify's CUDA kernels and the pure_nccl communicator.
#
# Runs on a machine with a CUDA GPU, CuPy 13/14, numpy 1/2, mpi4py and NCCL -- no Chainer and
# no network needed -- from the repository root, in well under 8 minutes:
#   1. what is there (nvidia-smi, versions, nccl_status),
#   2. the gpu-marked kernel and pure_nccl tests, plus the CPU-side kernel checks,
#   3. bench/gpu.py (pack+unpack vs device copy, BN statistics vs CuPy, channel gather).
# Results go to $OUT (or ./gpu-check-out): gpu-tests.log, gpu-junit.xml, bench_gpu.json,
# bench.log, env.txt, summary.txt. Exit status: non-zero when tests or the bench failed.
#
# pytest is needed for step 2. Where the GPU machine has none, prepare it beside the repo on a
# machine with network (pure-Python wheels, any Python 3):
#   python -m pip install --target .gpu-pydeps pytest pytest-timeout
# and bring .gpu-pydeps along; this script puts it on PYTHONPATH only when pytest is missing.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-check-out}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

echo "== environment"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    "$py" - <<'EOF'
import sys
print("python", sys.version.split()[0])
for name in ("numpy", "cupy", "mpi4py", "chainer"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as exc:
        print(name, "missing:", type(exc).__name__, exc)
from mnify.runtime.communicators.pure_nccl import nccl_status
print("nccl_status", nccl_status())
EOF
} 2>&1 | tee "$out/env.txt"

tests_rc=0
if ! "$py" -c "import pytest" 2>/dev/null && [ -d "$root/.gpu-pydeps" ]; then
    export PYTHONPATH="$PYTHONPATH:$root/.gpu-pydeps"
fi
# the GPU tests, plus the CPU-side kernel checks (twins, launch geometry, nvcc/NVRTC where present);
# not the stand-in tests, which need mpiexec and prove nothing more on a GPU machine
tests=(tests/gpu tests/kernels/test_kernels_device.py tests/kernels/test_kernels_host.py
    tests/kernels/test_kernel_plans.py tests/kernels/test_kernels_nvcc.py)
echo "== tests (${tests[*]})"
if "$py" -c "import pytest" 2>/dev/null; then
    timeout 300 "$py" -m pytest -p no:cacheprovider -q -rs \
        --junitxml="$out/gpu-junit.xml" "${tests[@]}" 2>&1 | tee "$out/gpu-tests.log"
    tests_rc=${PIPESTATUS[0]}
    note "tests: exit $tests_rc; $(tail -n 1 "$out/gpu-tests.log")"
    if grep -q "no CUDA device/CuPy" "$out/gpu-tests.log"; then
        note "WARNING: gpu-marked tests were SKIPPED (no CuPy/device seen by the tests)"
        tests_rc=1
    fi
else
    note "tests: NOT RUN -- pytest missing (see the header of scripts/gpu_check.sh)"
    tests_rc=1
fi

echo "== bench/gpu.py"
# shellcheck disable=SC2086 # MNIFY_BENCH_ARGS is a list of flags (e.g. --repeat 50)
timeout 240 "$py" bench/gpu.py --json "$out/bench_gpu.json" ${MNIFY_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}
note "bench: exit $bench_rc"
grep -E "goal|geometric|ratio" "$out/bench.log" >>"$summary" || true

echo "== summary ($out)"
cat "$summary"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
