#!/usr/bin/env bash
# Gradient compression on a slow network: two hosts (network namespaces joined by a veth pair whose
# both ends are limited to RATE by `tc qdisc ... tbf`), one `kolo train` worker each, ResNet-18 on
# Fashion-MNIST; for each --compression in turn (none, fp16, bf16), ROUNDS rounds alternating, it
# prints samples/s and the time per step (global batch / samples/s) of every run, then the medians.
# RATE may list several rates (1gbit,200mbit): each gets its own pair of hosts and runs.
#
# Usage: scripts/bench-compression.sh [KOLO] [ROUNDS] [RATE[,RATE...]] [TRAIN_LIMIT]
#        (default target/release/kolo, 3, 1gbit, 1024); COMPRESSIONS="none fp16 bf16" chooses which;
#        CSV (a file: the median ms per step of each compression against the link's nominal rate in
#        Mbit/s are also written there and drawn into the .png beside it with `kolo plot`).
# Needs root (CAP_NET_ADMIN), iproute2 with tc, and the data (scripts/fetch-data.sh); exits 77 when
# namespaces cannot be made here. No traffic leaves the machine.
set -euo pipefail
KOLO=$(realpath "${1:-target/release/kolo}")
ROUNDS=${2:-3}
RATE=${3:-1gbit}
LIMIT=${4:-1024}
read -r -a COMPS <<<"${COMPRESSIONS:-none fp16 bf16}"
BATCH=32
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/netns-lib.sh
source "$here/netns-lib.sh"
export KOLO_JOB_SECRET=${KOLO_JOB_SECRET:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
work=$(mktemp -d)
cleanup() {
    rm -rf "$work"
    if [[ -n ${ns0:-} ]]; then netns_down; fi
}
trap cleanup EXIT

# run COMPRESSION ROUND: one two-host training run; prints its samples/s.
run() {
    local out="$work/$1-$2"
    netns_on_both "$out" "$KOLO" train -n 1 --model resnet18 --dataset fashion-mnist \
        --train-limit "$LIMIT" --test-limit 200 --epochs 1 --batch-size "$BATCH" --no-progress \
        --compression "$1" --out "$out"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_second"])' \
        "$out/summary.json"
}

[[ -n ${CSV:-} ]] && (IFS=,; echo "link Mbit/s,${COMPS[*]}") >"$CSV"
IFS=, read -r -a RATES <<<"$RATE"
for rate in "${RATES[@]}"; do
    netns_up "kcmp$$"
    trap cleanup EXIT
    netns_limit "$rate"
    declare -A results=()
    for round in $(seq "$ROUNDS"); do
        for comp in "${COMPS[@]}"; do
            sps=$(run "$comp" "$round-$rate")
            results[$comp]+="$sps "
            awk -v s="$sps" -v b=$((2 * BATCH)) -v c="$comp" -v r="$round" \
                'BEGIN { printf "round %d %-5s %7.1f samples/s  %6.3f s/step\n", r, c, s, b / s }'
        done
    done
    echo
    echo "ResNet-18, 2 hosts x 1 worker, link $rate (tbf), global batch $((2 * BATCH)), medians of $ROUNDS:"
    row=$(python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit',sys.argv[1].lower()); \
print(float(m[1]) * {'':1e-6,'k':1e-3,'m':1,'g':1e3}[m[2]])" "$rate")
    for comp in "${COMPS[@]}"; do
        # shellcheck disable=SC2086
        med=$(printf '%s\n' ${results[$comp]} | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
        awk -v c="$comp" -v b=$((2 * BATCH)) -v m="$med" \
            'BEGIN { printf "  %-5s %7.1f samples/s  %6.3f s/step\n", c, m, b / m }'
        row+=",$(awk -v b=$((2 * BATCH)) -v m="$med" 'BEGIN { print 1000 * b / m }')"
    done
    [[ -n ${CSV:-} ]] && echo "$row" >>"$CSV"
    netns_down
done
if [[ -n ${CSV:-} ]]; then
    "$KOLO" plot "$CSV" --out "${CSV%.*}.png" --y-desc "ms per step (median of $ROUNDS)" \
        --title "ResNet-18, 2 hosts x 1 worker, gradient compression on a slow link — $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
fi
