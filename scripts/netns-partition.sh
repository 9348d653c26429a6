#!/usr/bin/env bash
# A network partition between two hosts (network namespaces, see netns-lib.sh): runs
# `KOLO SUBCOMMAND -n NPROC --nnodes 2 --node-rank R ... ARGS` on each, waits until node 0's output
# matches READY (an extended regular expression), then cuts the link by setting both ends of the
# veth pair down (packets vanish, nothing is reset) and times each launcher's exit from the cut.
#
# Usage: scripts/netns-partition.sh KOLO NPROC READY -- SUBCOMMAND [ARGS...]
# Prints, once both launchers are gone (each is bounded to 60 s):
#   partition: node R exit CODE after S s         (per node: its exit code, seconds after the cut)
#   partition: node R left a process: PID ARGS     (per process still in that namespace, then killed)
# then both launchers' output, each line prefixed with `[node R] `. Exits 0 when the cut was made,
# 2 when READY never showed (or a launcher ended before the cut), 77 when namespaces cannot be made.
set -euo pipefail
KOLO=$(realpath "$1") NPROC=$2 READY=$3
shift 4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/netns-lib.sh
source "$here/netns-lib.sh"
tag="kolp$$"
netns_up "$tag"
out=$(mktemp -d)
trap 'netns_down; rm -rf "$out"' EXIT

sub=$1
shift
export KOLO_JOB_SECRET=${KOLO_JOB_SECRET:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
port=$((29000 + $$ % 1000))
for r in 0 1; do
    ns=$([[ $r == 0 ]] && echo "$ns0" || echo "$ns1")
    iface=$([[ $r == 0 ]] && echo "$if0" || echo "$if1")
    (exec ip netns exec "$ns" timeout 60 "$KOLO" "$sub" -n "$NPROC" --nnodes 2 \
        --node-rank "$r" --master-addr 10.77.0.1 --master-port "$port" --iface "$iface" "$@" \
        >"$out/node$r.log" 2>&1) &
    eval "pid$r=$!"
done

show_logs() {
    local r
    for r in 0 1; do sed "s/^/[node $r] /" "$out/node$r.log"; done
}

ready=0
for _ in $(seq 1200); do
    if grep -Eq -- "$READY" "$out/node0.log"; then ready=1; break; fi
    if ! kill -0 "$pid0" 2>/dev/null || ! kill -0 "$pid1" 2>/dev/null; then break; fi
    sleep 0.05
done
if ((ready == 0)) || ! kill -0 "$pid0" 2>/dev/null || ! kill -0 "$pid1" 2>/dev/null; then
    echo "partition: node 0 never printed '$READY' while both launchers ran" >&2
    wait "$pid0" "$pid1" || true
    show_logs
    exit 2
fi

ip -n "$ns0" link set "$if0" down
ip -n "$ns1" link set "$if1" down
cut=$(date +%s.%N)
took=("" "") rcs=("" "") gone=0
while ((gone < 2)); do
    for r in 0 1; do
        [[ -n ${took[$r]} ]] && continue
        pid=$([[ $r == 0 ]] && echo "$pid0" || echo "$pid1")
        if ! kill -0 "$pid" 2>/dev/null; then
            took[r]=$(awk -v a="$cut" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
            rc=0
            wait "$pid" || rc=$?
            rcs[r]=$rc
            gone=$((gone + 1))
        fi
    done
    sleep 0.02
done
for r in 0 1; do
    echo "partition: node $r exit ${rcs[$r]} after ${took[$r]} s"
done
for r in 0 1; do
    ns=$([[ $r == 0 ]] && echo "$ns0" || echo "$ns1")
    for p in $(ip netns pids "$ns" 2>/dev/null); do
        echo "partition: node $r left a process: $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null || true)"
        kill -9 "$p" 2>/dev/null || true
    done
done
show_logs
