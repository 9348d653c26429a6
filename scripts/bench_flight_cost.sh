#!/usr/bin/env bash
# What the flight recorder costs, in runs alternating recording on (KOLO_FLIGHT_RECORDS unset: the
# default ring) and off (KOLO_FLIGHT_RECORDS=0), medians over ROUNDS pairs:
#   - `kolo bench allreduce -n 2 --sizes 4` (time per 4-byte all-reduce, shared memory);
#   - `kolo train -n 2` LeNet on Fashion-MNIST, one epoch (samples/s), unless --no-train.
# Usage: [ITERS=2000000] scripts/bench_flight_cost.sh [KOLO] [ROUNDS] [--no-train]  (ITERS: all-reduces per run,
# about a second of them: runs of a tenth of a second moved by several per cent from one to the next)
# (examples/flight_cost.rs measures the same on one world with recording paused and resumed.)
set -euo pipefail
KOLO=${1:-target/release/kolo} ROUNDS=${2:-7} TRAIN=${3:-}
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "CPU: $cpu, $(nproc) cores; $ROUNDS alternating rounds"
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
bench() {
    env "$@" "$KOLO" bench allreduce -n 2 --sizes 4 --iters "${ITERS:-2000000}" --warmup 20000 --json |
        grep -o '"time_us":[0-9.]*' | cut -d: -f2
}
train() {
    local out
    out=$(mktemp -d)
    env "$@" "$KOLO" train -n 2 --epochs 1 --test-limit 1000 --no-progress --out "$out" >/dev/null
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['samples_per_second'])" \
        "$out/summary.json"
    rm -rf "$out"
}
on=() off=() ratios=() ton=() toff=() tratios=()
for r in $(seq "$ROUNDS"); do
    if ((r % 2)); then a=$(bench KOLO_X=1); b=$(bench KOLO_FLIGHT_RECORDS=0)
    else b=$(bench KOLO_FLIGHT_RECORDS=0); a=$(bench KOLO_X=1); fi
    on+=("$a") off+=("$b") ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { print a / b }')")
    echo "round $r: all-reduce 4 B: recording $a us, off $b us"
    if [[ $TRAIN != --no-train ]]; then
        if ((r % 2)); then a=$(train KOLO_X=1); b=$(train KOLO_FLIGHT_RECORDS=0)
        else b=$(train KOLO_FLIGHT_RECORDS=0); a=$(train KOLO_X=1); fi
        ton+=("$a") toff+=("$b") tratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { print b / a }')")
        echo "round $r: kolo train: recording $a samples/s, off $b samples/s"
    fi
done
m() { printf '%s\n' "$@" | median; }
echo "all-reduce 4 B: median recording $(m "${on[@]}") us, off $(m "${off[@]}") us;" \
    "median ratio $(m "${ratios[@]}") (time with / without)"
if [[ $TRAIN != --no-train ]]; then
    echo "kolo train: median recording $(m "${ton[@]}"), off $(m "${toff[@]}") samples/s;" \
        "median ratio $(m "${tratios[@]}") (time with / without)"
fi
