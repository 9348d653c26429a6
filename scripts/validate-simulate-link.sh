#!/usr/bin/env bash
# The simulator against two hosts joined by a slow link: two network namespaces whose veth pair is
# limited to RATE by `tc qdisc ... tbf`, one `kolo train` worker each (one compute thread), ResNet-18
# on Fashion-MNIST, batch 32 per worker. For each rate:
#
# 1. the link as kolo sees it, the way one would measure a real cluster before describing it:
#    `kolo bench allreduce` across the two hosts at 4 bytes (latency: a 2-rank all-reduce costs 2 alpha)
#    and 16 MiB (busbw, which for 2 ranks is the per-direction rate the ring moves data at);
# 2. two profiles of a ResNet-18 step taken at once (both workers compute at the same time here);
# 3. predictions by `kolo simulate --nodes 2 --ranks-per-node 1` with the nominal rate (and 100 us)
#    and with the measured rate and latency;
# 4. ROUNDS training runs across the two hosts: measured ms per step = global batch / samples/s.
#
# Usage: scripts/validate-simulate-link.sh [KOLO] [ROUNDS] [RATE...]
#        (default target/release/kolo, 3, 1gbit 200mbit); TRAIN_LIMIT (1024 samples a run);
#        MAX_ERR (10: exits 1 when the prediction from the measured link misses the measured step
#        time by more than this many percent at some rate); CSV (a file: the step times against
#        the link's nominal rate in Mbit/s are also written there and drawn into the .png beside it
#        with `kolo plot`).
# Needs root (CAP_NET_ADMIN), iproute2 with tc, and the data (scripts/fetch-data.sh); exits 77 when
# namespaces cannot be made here. No traffic leaves the machine.
set -euo pipefail
KOLO=$(realpath "${1:-target/release/kolo}")
ROUNDS=${2:-3}
shift $(($# < 2 ? $# : 2))
RATES=("${@:-1gbit 200mbit}")
# shellcheck disable=SC2206
RATES=(${RATES[*]})
LIMIT=${TRAIN_LIMIT:-1024}
BATCH=32
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/netns-lib.sh
source "$here/netns-lib.sh"
export KOLO_JOB_SECRET=${KOLO_JOB_SECRET:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
work=$(mktemp -d)

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
json() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }

rows=()
misses=()
[[ -n ${CSV:-} ]] && echo "link Mbit/s,predicted (nominal link),predicted (measured link),measured" >"$CSV"
for rate in "${RATES[@]}"; do
    netns_up "kval$$"
    trap 'netns_down; rm -rf "$work"' EXIT
    netns_limit "$rate"
    nominal=$(python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit',sys.argv[1].lower()); \
print(float(m[1]) * {'':1e-9,'k':1e-6,'m':1e-3,'g':1}[m[2]])" "$rate")

    # 1. The link, through kolo: latency from 4-byte all-reduces, rate from 16 MiB ones.
    netns_on_both "$work/link-$rate" "$KOLO" bench allreduce -n 1 --sizes 4,16M --iters 5 --warmup 2 --json
    lat_us=$(grep '"bytes":4,' "$work/link-$rate.node0.log" |
        python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["time_us"] / 2)')
    gbps=$(grep '"bytes":16777216' "$work/link-$rate.node0.log" |
        python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["busbw_gbps"] * 8)')

    # 2. Two profiles at once, as the two workers compute at once.
    for i in 0 1; do
        RAYON_NUM_THREADS=1 "$KOLO" simulate --model resnet18 --batch "$BATCH" --input-shape 1x28x28 \
            --threads 1 --steps 8 --save-profile "$work/prof-$rate-$i.json" --profile-only \
            >/dev/null 2>&1 &
    done
    wait
    prof="$work/prof-$rate-0.json,$work/prof-$rate-1.json"

    # 3. Predictions: nominal link, measured link.
    # (One rank per node: the intra-node link, which the description needs, carries nothing.)
    predict() {
        "$KOLO" simulate --profile "$prof" --ranks 2 --nodes 2 --ranks-per-node 1 --cores-per-node 1 \
            --intra-gbps 100 --intra-latency-us 1 --inter-gbps "$1" --inter-latency-us "$2" \
            --csv "$work/pred.csv" >/dev/null
        awk -F, 'NR==2 {print $3 * 1000}' "$work/pred.csv"
    }
    p_nominal=$(predict "$nominal" 100)
    p_measured=$(predict "$gbps" "$lat_us")

    # 4. Training across the link.
    ms=()
    for round in $(seq "$ROUNDS"); do
        out="$work/train-$rate-$round"
        netns_on_both "$out" "$KOLO" train -n 1 --model resnet18 --dataset fashion-mnist \
            --train-limit "$LIMIT" --test-limit 200 --epochs 1 --batch-size "$BATCH" --no-progress \
            --out "$out"
        sps=$(json "$out/summary.json" samples_per_second)
        ms+=("$(python3 -c "print(2 * $BATCH / $sps * 1000)")")
        echo "# $rate round $round: $(python3 -c "print(f'{2 * $BATCH / $sps * 1000:.0f}')") ms/step" >&2
    done
    m=$(median "${ms[@]}")
    if python3 -c "import sys; sys.exit(abs(($p_measured - $m) / $m * 100) <= ${MAX_ERR:-10})"; then
        misses+=("$rate")
    fi
    rows+=("$(python3 -c "
n, g, l, pn, pm, m = '$rate', $gbps, $lat_us, $p_nominal, $p_measured, $m
print(f'{n:>8} {g:9.3f} {l:8.0f} {pn:10.0f} {(pn - m) / m * 100:+7.1f}% {pm:10.0f} {(pm - m) / m * 100:+7.1f}% {m:9.0f}')")")
    [[ -n ${CSV:-} ]] && echo "$(python3 -c "print($nominal * 1000)"),$p_nominal,$p_measured,$m" >>"$CSV"
    netns_down
    trap 'rm -rf "$work"' EXIT
done
if [[ -n ${CSV:-} ]]; then
    "$KOLO" plot "$CSV" --out "${CSV%.*}.png" --y-desc "ms per step" \
        --title "ResNet-18, 2 hosts x 1 worker, batch $BATCH each: simulated vs measured — $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
fi
echo "ResNet-18, 2 hosts x 1 worker, batch $BATCH each; ms per step (medians of $ROUNDS runs)"
printf '%8s %9s %8s %10s %8s %10s %8s %9s\n' link meas_gbps lat_us pred_nom err pred_meas err measured
printf '%s\n' "${rows[@]}"
if ((${#misses[@]})); then
    echo "validate-simulate-link: the prediction from the measured link is off by more than ${MAX_ERR:-10} % at: ${misses[*]}" >&2
    exit 1
fi
echo "validate-simulate-link: every prediction from the measured link within ${MAX_ERR:-10} %"
