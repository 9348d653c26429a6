#!/usr/bin/env bash
# Runs COMMAND with two "hosts" up (network namespaces, see netns-lib.sh) and deletes them after;
# the command finds them in KOLO_NETNS="NS0 IF0 NS1 IF1" (10.77.0.1 on IF0 in NS0, 10.77.0.2 on
# IF1 in NS1). Exits with the command's code, 77 when namespaces cannot be made here (needs root).
#
# Usage: scripts/netns-with.sh COMMAND [ARGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/netns-lib.sh
source "$here/netns-lib.sh"
netns_up "kolw$$"
rc=0
KOLO_NETNS="$ns0 $if0 $ns1 $if1" "$@" || rc=$?
exit "$rc"
