#!/bin/sh
# mnify test bed launch agent: Open MPI calls this instead of ssh to start a command "on" a host.
#
#   agent.sh [ssh-options] HOST COMMAND...   ssh-compatible: COMMAND words are joined and run by sh,
#                                            which is what Open MPI's plm_ssh_agent expects
#   agent.sh --exec HOST ARGV...             runs ARGV exactly (no shell re-parsing)
#
# A host is a network namespace named "$MNIFY_TESTBED-HOST" (testkit/testbed.py builds them).
# The command runs inside that namespace and inside a fresh UTS namespace whose hostname is HOST,
# so MPI_Get_processor_name() tells the hosts apart the way it does on a real cluster. The
# environment passes through unchanged (Open MPI adds PATH/LD_LIBRARY_PATH/PRTE_PREFIX itself).
set -eu

die() {
    echo "mnify testbed agent: $*" >&2
    exit 255 # what ssh returns when it cannot reach the host
}

mode=shell
if [ "${1:-}" = "--exec" ]; then
    mode=exec
    shift
else
    # Skip ssh options Open MPI (or a user) may pass before the host name.
    while [ $# -gt 0 ]; do
        case "$1" in
        -[bcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
        -*) shift ;;
        *) break ;;
        esac
    done
fi
[ $# -ge 2 ] || die "usage: agent.sh [--exec] HOST COMMAND..."
[ -n "${MNIFY_TESTBED:-}" ] || die "MNIFY_TESTBED is not set (the test bed's name prefix)"
host="$1"
shift
netns="$MNIFY_TESTBED-$host"
[ -e "/run/netns/$netns" ] || [ -e "/var/run/netns/$netns" ] ||
    die "no host '$host' in test bed '$MNIFY_TESTBED' (network namespace $netns does not exist)"

if [ "$mode" = exec ]; then
    exec ip netns exec "$netns" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
fi
# ssh joins its arguments with spaces and hands the string to the remote shell: do the same.
exec ip netns exec "$netns" unshare --uts -- sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
