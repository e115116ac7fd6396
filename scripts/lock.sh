#!/usr/bin/env bash
# Refresh requirements/dev.lock to the newest versions pyproject.toml's ranges allow, then run
# the quick tier against them in a scratch environment and print what broke: upgrading is a
# deliberate step (commit the new lock once the breakage is fixed, or keep the old one).
#   bash scripts/lock.sh            refresh, then test the new versions
#   bash scripts/lock.sh --no-test  refresh only
# The lock is made by uv (`uv pip compile --generate-hashes`, pinned below) for CPython 3.11 on
# Linux x86_64; set-up installs it with plain pip (scripts/setup.sh). Chainer 7.8.1's sdist is
# resolved against setuptools<70 without build isolation, as set-up builds it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
uv_version="0.13.9"
py="${PYTHON:-python3.11}"
work="$(mktemp -d "${TMPDIR:-/tmp}/mnify-lock.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "== tools (uv $uv_version, setuptools<70 for Chainer's sdist)" >&2
"$py" -m venv "$work/tools"
"$work/tools/bin/python" -m pip -q --disable-pip-version-check install "uv==$uv_version" "setuptools<70" wheel
old="$work/old.lock"
cp requirements/dev.lock "$old" 2>/dev/null || : >"$old"
echo "== uv pip compile" >&2
UV_CUSTOM_COMPILE_COMMAND="bash scripts/lock.sh" "$work/tools/bin/uv" pip compile \
  pyproject.toml requirements/build.in --extra dev --extra plot --extra chainer \
  --generate-hashes --upgrade --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --no-build-isolation-package chainer --python "$work/tools/bin/python" --quiet \
  -o requirements/dev.lock
echo "== what changed" >&2
pins() { grep -E '^[A-Za-z0-9._-]+==' "$1" | sed 's/ \\$//' | sort; }
changed="$(diff <(pins "$old") <(pins requirements/dev.lock) | grep -E '^[<>]' || true)"
if [ -z "$changed" ]; then echo "no version changed"; else echo "$changed"; fi
if [ "${1:-}" = "--no-test" ] || [ -z "$changed" ]; then exit 0; fi
echo "== the quick tier on the new versions (scratch environment $work/venv)" >&2
export MNIFY_VENV="$work/venv"
bash scripts/setup.sh
bin="$MNIFY_VENV/bin"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
broke=()
run() {
  local name="$1"; shift
  if "$@" >"$work/$name.log" 2>&1; then echo "ok     $name"; else
    echo "BROKE  $name:"; grep -E 'error|FAILED|ERROR|would reformat' "$work/$name.log" | head -40 | sed 's/^/         /'
    broke+=("$name")
  fi
}
run ruff "$bin/ruff" check mnify tests bench examples testkit
run ruff-format "$bin/ruff" format --check mnify tests bench examples testkit
run mypy "$bin/mypy" mnify
MNIFY_HYPOTHESIS_PROFILE=mnify-quick run pytest-quick "$bin/python" -m pytest -p no:cacheprovider \
  -q -n "${MNIFY_TEST_WORKERS:-4}" --dist loadgroup \
  -m "not slow and not multihost and not gpu and (smoke or not mpi)"
if [ "${#broke[@]}" -gt 0 ]; then
  echo "lock: the new versions break: ${broke[*]}. requirements/dev.lock is refreshed; fix these before committing it (git checkout requirements/dev.lock keeps the old one)."
  exit 1
fi
echo "lock: the quick tier passes on the new versions; commit requirements/dev.lock."
