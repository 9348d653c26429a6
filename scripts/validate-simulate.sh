#!/usr/bin/env bash
# Predicted (kolo simulate) vs measured (kolo train) step times of LeNet on this machine at 1, 2, 4
# and 8 processes. Each world size is predicted from profiles taken with the compute threads kolo
# train gives each worker (cores / N, at least 1), by min(N, cores) profiling processes at once; beyond the cores the simulator slows compute
# down by ranks x threads / cores (oversubscription, cores_per_node in the cluster file, default:
# this machine's cores). Measured step time = batch x N / samples_per_second of summary.json.
#
# Usage: scripts/validate-simulate.sh [RANKS...]   (default 1 2 4 8)
# Environment: KOLO (binary, default target/debug/kolo), MODEL (lenet), BATCH (64), STEPS (40 steps
# per rank to measure), PROFILE_STEPS (30), INPUT_SHAPE (1x28x28, the dataset's), REPEAT (3: medians of that many profiles and runs), DATASET (mnist), DATA_DIR (data/mnist), OUT (a temporary directory),
# MAX_ERR (10: the script exits 1 when a prediction misses the measurement by more than this many
# percent, naming the world sizes), CSV (a file: the predicted and measured step times per world
# size are also written there and drawn into the .png beside it with `kolo plot`).
set -euo pipefail
cd "$(dirname "$0")/.."
KOLO=${KOLO:-target/debug/kolo}
MODEL=${MODEL:-lenet}
BATCH=${BATCH:-64}
STEPS=${STEPS:-60}
PROFILE_STEPS=${PROFILE_STEPS:-30}
REPEAT=${REPEAT:-3}
DATASET=${DATASET:-mnist}
DATA_DIR=${DATA_DIR:-data/mnist}
INPUT_SHAPE=${INPUT_SHAPE:-1x28x28}
OUT=${OUT:-$(mktemp -d)}
MAX_ERR=${MAX_ERR:-10}
CORES=$(nproc)
misses=()
RANKS=("${@:-1 2 4 8}")
# shellcheck disable=SC2206
RANKS=(${RANKS[*]})
mkdir -p "$OUT"
sed "s/\"cores_per_node\": [0-9]*/\"cores_per_node\": $CORES/" scripts/local-cluster.json >"$OUT/cluster.json"

median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

printf '%6s %8s %13s %13s %8s\n' ranks threads predicted_ms measured_ms error_%
[[ -n ${CSV:-} ]] && echo "ranks,predicted (kolo simulate),measured (kolo train)" >"$CSV"
for n in "${RANKS[@]}"; do
  t=$((CORES / n)); [ "$t" -ge 1 ] || t=1
  preds=() meass=()
  for r in $(seq "$REPEAT"); do
    # A fresh profile each time (its noise, other work on the machine, is independent), taken by as
    # many processes at once as ranks will compute at once (min(N, cores)), averaged: co-located
    # ranks contend for memory bandwidth and caches.
    k=$((n < CORES ? n : CORES))
    profs=()
    for i in $(seq "$k"); do
      profs+=("$OUT/profile-n$n-$r-$i.json")
      RAYON_NUM_THREADS=$t GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295:glibc.malloc.hugetlb=1 \
        "$KOLO" simulate --model "$MODEL" --batch "$BATCH" --steps "$PROFILE_STEPS" --threads "$t" \
        --input-shape "$INPUT_SHAPE" --save-profile "$OUT/profile-n$n-$r-$i.json" --profile-only 2>/dev/null &
    done
    wait
    prof=$(IFS=,; echo "${profs[*]}")
    "$KOLO" simulate --profile "$prof" --cluster "$OUT/cluster.json" --ranks "$n" \
      --threads-per-rank "$t" --csv "$OUT/pred-$n-$r.csv" >/dev/null
    preds+=("$(awk -F, 'NR==2 {print $3 * 1000}' "$OUT/pred-$n-$r.csv")")
    run="$OUT/train-$n-$r"
    rm -rf "$run"
    "$KOLO" train -n "$n" --model "$MODEL" --dataset "$DATASET" --data-dir "$DATA_DIR" \
      --batch-size "$BATCH" --epochs 1 --train-limit $((BATCH * n * STEPS)) --test-limit "$BATCH" \
      --no-progress --out "$run" >"$run.log" 2>&1
    sps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['samples_per_second'])" "$run/summary.json")
    meass+=("$(python3 -c "print($BATCH * $n / $sps * 1000)")")
  done
  pred=$(median "${preds[@]}")
  meas=$(median "${meass[@]}")
  err=$(python3 -c "print(f'{($pred - $meas) / $meas * 100:+.1f}')")
  printf '%6s %8s %13.2f %13.2f %8s\n' "$n" "$t" "$pred" "$meas" "$err"
  [[ -n ${CSV:-} ]] && echo "$n,$pred,$meas" >>"$CSV"
  if python3 -c "import sys; sys.exit(abs($err) <= $MAX_ERR)"; then
    misses+=("$n ranks: $err %")
  fi
done
if [[ -n ${CSV:-} ]]; then
  "$KOLO" plot "$CSV" --out "${CSV%.*}.png" --x-desc "processes (ranks)" --y-desc "step time (ms)" \
    --title "$MODEL, batch $BATCH per rank: predicted vs measured step time — $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $CORES cores"
fi
if ((${#misses[@]})); then
  echo "validate-simulate: predictions off by more than $MAX_ERR %: ${misses[*]}" >&2
  exit 1
fi
echo "validate-simulate: every prediction within $MAX_ERR % of the measurement"
