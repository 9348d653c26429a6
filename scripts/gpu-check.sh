#!/usr/bin/env bash
# The checks of kolo's NCCL engine that need NVIDIA GPUs (kolo's CI has none): run on a machine with
# at least one GPU, its driver, and NCCL 2.18+ (libnccl.so.2 on LD_LIBRARY_PATH, $KOLO_NCCL_LIBRARY,
# or the one PyTorch's wheels install: scripts/install-torch.sh).
#
#   1. kolo-nccl's own tests (with a driver present, the no-GPU error tests step aside);
#   2. the conformance matrix on NCCL — every collective, element type and operator, checked against
#      expected values — with 1, 2, ... one rank per GPU (up to 4), started by `kolo run`;
#   3. a mismatched call on 2 GPUs: every rank must fail with an error, not hang;
#   4. the matrix example under KOLO_BACKEND=nccl;
#   5. kolo train --device cuda (LeNet / Fashion-MNIST, 3 epochs, one worker per GPU) on kolo's
#      transports and on NCCL: each must reach 85 % test accuracy.
#
# Usage: scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if ((gpus < 1)); then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi -L lists none)" >&2
  exit 1
fi
if [[ -z "${KOLO_NCCL_LIBRARY:-}" ]] && ! ldconfig -p | grep -q 'libnccl.so.2'; then
  KOLO_NCCL_LIBRARY=$(find "$HOME/.cache/kolo" -name libnccl.so.2 2>/dev/null | head -1)
  export KOLO_NCCL_LIBRARY
fi
echo "gpu-check: $gpus GPU(s); NCCL: ${KOLO_NCCL_LIBRARY:-as the system finds it}"

command -v nvcc >/dev/null || . scripts/cuda-env.sh
cargo test --release -p kolo-nccl
cargo build --release -p kolo-cli --features kolo-cli/cuda,kolo-cli/nccl
cargo build --release -p kolo --features nccl --examples
conformance=$(cargo test --release -p kolo --features nccl --test conformance --no-run \
  --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "conformance":
        print(m["executable"])')

for ((n = 1; n <= (gpus < 4 ? gpus : 4); n++)); do
  echo "gpu-check: conformance on NCCL, $n rank(s)"
  target/release/kolo run -n "$n" -- "$conformance" --ignored --exact nccl::nccl_rank --nocapture
done
if ((gpus >= 2)); then
  echo "gpu-check: a mismatched call on 2 ranks"
  KOLO_TIMEOUT=30 timeout 120 target/release/kolo run -n 2 -- \
    "$conformance" --ignored --exact nccl::nccl_mismatch_rank --nocapture
fi
# The example's world size must divide 8.
m=1
while ((m * 2 <= gpus && m * 2 <= 8)); do m=$((m * 2)); done
echo "gpu-check: the matrix example on NCCL, $m rank(s)"
KOLO_BACKEND=nccl target/release/kolo run -n "$m" -- target/release/examples/matrix
for backend in kolo nccl; do
  echo "gpu-check: kolo train --device cuda -n $gpus, KOLO_BACKEND=$backend"
  out=$(KOLO_BACKEND=$backend target/release/kolo train -n "$gpus" --device cuda --model lenet \
    --epochs 3 --no-progress --out "$(mktemp -d)" 2>&1 | tee /dev/stderr)
  acc=$(sed -n 's/.*final test accuracy \([0-9.]*\)%.*/\1/p' <<<"$out")
  if [[ -z $acc ]] || ! awk -v a="$acc" 'BEGIN { exit !(a >= 85) }'; then
    echo "gpu-check: kolo train on $backend: accuracy '${acc}' below 85 %" >&2
    exit 1
  fi
done
echo "gpu-check: all passed"
