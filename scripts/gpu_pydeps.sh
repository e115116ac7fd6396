#!/usr/bin/env bash
# Prepare .gpu-pydeps/ for scripts/gpu_check.sh's test step, on a machine that reaches the
# package registry (the lent GPU machine does not): pytest and pytest-timeout with their
# dependencies, as pure-Python wheels for the GPU machine's Python (3.12 by default), unpacked
# so that PYTHONPATH=.gpu-pydeps imports them. Nothing is installed into any environment.
# Then carry `.gpu-pydeps` with the device call (it is git-ignored; a few MiB).
#   GPU_PYTHON_VERSION=3.12 PIP="python3 -m pip" bash scripts/gpu_pydeps.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.gpu-pydeps"
pip=(${PIP:-python3 -m pip})
version="${GPU_PYTHON_VERSION:-3.12}"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
# pure-Python wheels only (py3-none-any): they run on any CPython 3 of any platform
only=(--only-binary=:all: --implementation py --abi none --platform any --python-version "$version")
"${pip[@]}" download --quiet --dest "$wheels" "${only[@]}" "pytest>=8" "pytest-timeout>=2.2"
rm -rf "$dest"
mkdir -p "$dest"
for wheel in "$wheels"/*.whl; do
    python3 -m zipfile -e "$wheel" "$dest"
done
ls "$wheels" | sed 's/^/  /' >"$dest/WHEELS.txt"
echo "prepared $dest from:"
cat "$dest/WHEELS.txt"
du -sh "$dest"
