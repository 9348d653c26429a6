#!/usr/bin/env bash
# Predicted (kolo simulate) vs measured (kolo train) step times of LeNet on this machine at 1, 2, 4
# and 8 processes. Each world size is predicted from a profile taken with the compute threads kolo
# train gives each worker (cores / N, at least 1); beyond the cores the simulator slows compute
# down by ranks x threads / cores (oversubscription, cores_per_node in the cluster file, default:
# this machine's cores). Measured step time = batch x N / samples_per_second of summary.json.
#
# Usage: scripts/validate-simulate.sh [RANKS...]   (default 1 2 4 8)
# Environment: KOLO (binary, default target/debug/kolo), MODEL (lenet), BATCH (64), STEPS (40 steps
# per rank to measure), DATASET (mnist), DATA_DIR (data/mnist), OUT (a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
KOLO=${KOLO:-target/debug/kolo}
MODEL=${MODEL:-lenet}
BATCH=${BATCH:-64}
STEPS=${STEPS:-40}
DATASET=${DATASET:-mnist}
DATA_DIR=${DATA_DIR:-data/mnist}
OUT=${OUT:-$(mktemp -d)}
CORES=$(nproc)
RANKS=("${@:-1 2 4 8}")
# shellcheck disable=SC2206
RANKS=(${RANKS[*]})
mkdir -p "$OUT"
sed "s/\"cores_per_node\": [0-9]*/\"cores_per_node\": $CORES/" scripts/local-cluster.json >"$OUT/cluster.json"

printf '%6s %8s %13s %13s %8s\n' ranks threads predicted_ms measured_ms error_%
for n in "${RANKS[@]}"; do
  t=$((CORES / n)); [ "$t" -ge 1 ] || t=1
  prof="$OUT/profile-t$t.json"
  if [ ! -f "$prof" ]; then
    RAYON_NUM_THREADS=$t GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295 \
      "$KOLO" simulate --model "$MODEL" --batch "$BATCH" --steps 20 --threads "$t" \
      --save-profile "$prof" --profile-only 2>/dev/null
  fi
  "$KOLO" simulate --profile "$prof" --cluster "$OUT/cluster.json" --ranks "$n" \
    --threads-per-rank "$t" --csv "$OUT/pred-$n.csv" >/dev/null
  pred=$(awk -F, 'NR==2 {print $3 * 1000}' "$OUT/pred-$n.csv")
  run="$OUT/train-$n"
  rm -rf "$run"
  "$KOLO" train -n "$n" --model "$MODEL" --dataset "$DATASET" --data-dir "$DATA_DIR" \
    --batch-size "$BATCH" --epochs 1 --train-limit $((BATCH * n * STEPS)) --test-limit "$BATCH" \
    --no-progress --out "$run" >"$OUT/train-$n.log" 2>&1
  sps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['samples_per_second'])" "$run/summary.json")
  meas=$(python3 -c "print($BATCH * $n / $sps * 1000)")
  err=$(python3 -c "print(f'{($pred - $meas) / $meas * 100:+.1f}')")
  printf '%6s %8s %13.2f %13.2f %8s\n' "$n" "$t" "$pred" "$meas" "$err"
done
