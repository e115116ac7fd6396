#!/usr/bin/env bash
# Install what the multi-host test bed (testkit/testbed.py) needs when it is missing:
# ip and tc (iproute2), unshare (util-linux), hostname. Idempotent: does nothing when all are there.
# Never fails the caller: without root or apt-get it says what is missing and the multi-host tests
# then fail with the same message (they only skip where the kernel refuses namespaces).
set -uo pipefail
declare -A package_of=([ip]=iproute2 [tc]=iproute2 [unshare]=util-linux [hostname]=hostname)
missing=()
for tool in ip tc unshare hostname; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${package_of[$tool]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-testbed-deps: missing $packages; install them as root (multi-host tests need them)" >&2
  exit 0
fi
echo "install-testbed-deps: installing $packages" >&2
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages; } >&2; then
  echo "install-testbed-deps: apt-get failed; multi-host tests will report the missing tools" >&2
fi
exit 0
