#!/usr/bin/env bash
# Two hosts on one machine: network namespaces kolo-h0 (10.77.0.1) and kolo-h1 (10.77.0.2) joined by
# a veth pair, no other interface but their own loopback. Runs `kolo run --nnodes 2` in each with
# the given program and prints both launchers' output; exits with the first non-zero exit code.
#
# Usage: scripts/netns-two-hosts.sh [--hosts] KOLO NPROC_PER_NODE -- PROGRAM [ARGS...]
# With --hosts, one `kolo run --hosts NS0:N,NS1:N` from outside starts both launchers through
# scripts/netns-ssh (standing in for ssh) instead.
# Needs root (CAP_NET_ADMIN) and iproute2; exits 77 when namespaces cannot be made here.
set -euo pipefail
mode=nodes
if [[ ${1:-} == --hosts ]]; then mode=hosts; shift; fi
KOLO=$1 NPROC=$2
shift 3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/netns-lib.sh
source "$here/netns-lib.sh"
tag="kolo$$"
netns_up "$tag"

out=$(mktemp -d)
if [[ $mode == hosts ]]; then
    rc=0
    KOLO_SSH="$here/netns-ssh" timeout 120 "$KOLO" run -n $((2 * NPROC)) \
        --hosts "$ns0:$NPROC,$ns1:$NPROC" --master-addr 10.77.0.1 \
        --master-port $((29000 + $$ % 1000)) -- "$@" || rc=$?
    rm -rf "$out"
    exit "$rc"
fi
export KOLO_JOB_SECRET=${KOLO_JOB_SECRET:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
port=$((29000 + $$ % 1000))
for r in 0 1; do
    ns=$([[ $r == 0 ]] && echo "$ns0" || echo "$ns1")
    iface=$([[ $r == 0 ]] && echo "$if0" || echo "$if1")
    ip netns exec "$ns" timeout 120 "$KOLO" run -n "$NPROC" --nnodes 2 --node-rank "$r" \
        --master-addr 10.77.0.1 --master-port "$port" --iface "$iface" -- "$@" \
        >"$out/node$r.log" 2>&1 &
    eval "pid$r=$!"
done
rc0=0 rc1=0
wait "$pid0" || rc0=$?
wait "$pid1" || rc1=$?
for r in 0 1; do
    sed "s/^/[node $r] /" "$out/node$r.log"
done
rm -rf "$out"
if ((rc0 != 0)); then exit "$rc0"; fi
exit "$rc1"
