#!/usr/bin/env bash
# Set everything up (idempotent) and run the whole suite: ruff, mypy, nvcc compile checks
# (where nvcc exists), and pytest with real MPI ranks.
#   bash scripts/test.sh            everything (what CI runs)
#   bash scripts/test.sh --quick    the quick tier for day-to-day work: single-process tests but
#                                   the slow ones, property tests at a small draw, and the few
#                                   2-rank runs marked smoke (tests/conftest.py marks every test
#                                   that launches ranks as mpi)
# Other arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
# The multi-host test bed needs ip, unshare and tc (root); install them where they are missing.
if [ -f scripts/install-testbed-deps.sh ]; then bash scripts/install-testbed-deps.sh; fi
bin="${MNIFY_VENV:-$root/.venv}/bin"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== lock (requirements/dev.lock against pyproject.toml)" && "$bin/python" scripts/lock_check.py
echo "== ruff check" && "$bin/ruff" check mnify tests bench examples testkit
echo "== ruff format --check" && "$bin/ruff" format --check mnify tests bench examples testkit
echo "== mypy" && "$bin/mypy" mnify
quick=()
if [ "${1:-}" = "--quick" ]; then
  shift
  quick=(-m "not slow and not multihost and not gpu and (smoke or not mpi)")
  export MNIFY_HYPOTHESIS_PROFILE="${MNIFY_HYPOTHESIS_PROFILE:-mnify-quick}"
fi
# The multi-rank tests mostly wait (on mpiexec starting, on ranks that are meant to hang), so
# several pytest workers share the 2 cores; tests that share a cached run are grouped
# (xdist_group). MNIFY_TEST_WORKERS=0 runs everything in this process.
workers=(-n "${MNIFY_TEST_WORKERS:-4}" --dist loadgroup)
echo "== pytest"
set +e
"$bin/python" -m pytest -p no:cacheprovider --timeout=600 "${workers[@]}" "${quick[@]}" "$@"
rc=$?
set -e
# pytest's 5 means "no tests collected": a suite that ran nothing must not pass.
exit "$rc"
