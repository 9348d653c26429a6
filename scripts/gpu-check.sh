#!/usr/bin/env bash
# The checks of kolo on NVIDIA GPUs (kolo's CI has none). Needs at least one GPU, its driver and
# NCCL 2.18+ (libnccl.so.2 on LD_LIBRARY_PATH, $KOLO_NCCL_LIBRARY, or the one PyTorch's wheels
# install: scripts/install-torch.sh); CUDA's libraries (cudart, cublas, curand) for the CUDA
# training, e.g. from the same wheels.
#
#   1. kolo-nccl's tests, with the GPU one: a world of one joins, reduces device memory
#      (NcclEngine::all_reduce_device, the queued device collectives), splits and closes;
#   2. the conformance matrix on NCCL (every collective, element type and operator, against
#      expected values) with 1 and 2 ranks, and up to 4 where the GPUs are there;
#   3. a mismatched call on 2 ranks: every rank fails with an error, none hangs;
#   4. GPU tensors on NCCL (kolo-ddp's tests/gpu.rs): all-reduce of every float type and
#      operator against the host's arithmetic; the DDP invariant with gradient buckets on the GPU;
#      a mismatched GPU collective; a peer that exits (rank 0's next collective fails in seconds);
#   5. the flight record of GPU collectives (a queued one stays `started` until its wait sees it
#      done) and `kolo diagnose` on a rank stuck in its own code while the other waits in a GPU
#      collective: the collective, who never entered it and where it last was, who waited;
#   6. the matrix example under KOLO_BACKEND=nccl;
#   7. kolo train --device cuda (LeNet / Fashion-MNIST, 3 epochs) on kolo's transports and on
#      NCCL, one worker per GPU, and on 2 ranks on NCCL (gradient buckets on the GPU): each must
#      reach 85 % test accuracy.
#
# Every check counts what it must see, one line per rank (`rank R: ... ok`), besides the exit
# status: a rank that returned early, or a test filter that matched nothing, fails the check. With
# fewer GPUs than ranks, ranks share GPUs (KOLO_CUDA_DEVICE = rank mod GPUs; NCCL_HOSTID per rank
# and NCCL_MULTI_RANK_GPU_ENABLE so that NCCL accepts it, its ranks then talking over its socket
# transport on loopback): enough to check results, not to time them.
#
# Usage: scripts/gpu-check.sh                 build (release; nvcc: scripts/cuda-env.sh), then check
#        scripts/gpu-check.sh --prebuilt DIR  check the binaries scripts/gpu-pack.sh put in DIR (a GPU
#                                             machine without Rust); LOGS=DIR keeps every check's log
set -uo pipefail
cd "$(dirname "$0")/.."

prebuilt=
if [[ ${1:-} == --prebuilt ]]; then
  prebuilt=$(cd "${2:?--prebuilt needs a directory}" && pwd) || exit 2
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if ((gpus < 1)); then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi -L lists none)" >&2
  exit 1
fi
if [[ -z "${KOLO_NCCL_LIBRARY:-}" ]] && ! ldconfig -p | grep -q 'libnccl.so.2'; then
  KOLO_NCCL_LIBRARY=$(find "$HOME/.cache/kolo" -name libnccl.so.2 2>/dev/null | head -1)
  export KOLO_NCCL_LIBRARY
fi
echo "gpu-check: $gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
echo "gpu-check: NCCL: ${KOLO_NCCL_LIBRARY:-as the system finds it}"

if [[ -n $prebuilt ]]; then
  bin=$prebuilt
  nccl_tests=$bin/kolo-nccl-tests conformance=$bin/conformance gpu_tests=$bin/kolo-ddp-gpu
  matrix=$bin/matrix kolo=$bin/kolo
else
  command -v nvcc >/dev/null || . scripts/cuda-env.sh
  test_exe() { # the test executable cargo builds for: cargo test ARGS --no-run
    cargo test --release "$@" --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | tail -1
  }
  set -e
  cargo build --release -p kolo-cli --features kolo-cli/cuda,kolo-cli/nccl
  cargo build --release -p kolo --features nccl --example matrix
  nccl_tests=$(test_exe -p kolo-nccl --lib)
  conformance=$(test_exe -p kolo --features nccl --test conformance)
  gpu_tests=$(test_exe -p kolo-ddp --features cuda,nccl --test gpu)
  set +e
  matrix=target/release/examples/matrix kolo=target/release/kolo
fi

logs=${LOGS:-$(mktemp -d)}
mkdir -p "$logs"
passed=0 failed=0 skipped=0
failures=()

# check NAME WANT PATTERN COMMAND: passes when COMMAND (a bash command line) exits 0 and prints
# exactly WANT lines matching PATTERN (an extended regex).
check() {
  local name=$1 want=$2 pattern=$3 command=$4 log rc got
  log="$logs/$(tr -c 'A-Za-z0-9._-' '_' <<<"$name" | sed 's/_*$//').log"
  echo "gpu-check: $name"
  timeout "${CHECK_TIMEOUT:-300}" bash -c "$command" >"$log" 2>&1
  rc=$?
  got=$(grep -cE "$pattern" "$log")
  if ((rc == 0 && got == want)); then
    passed=$((passed + 1))
    echo "  pass ($got of $want)"
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "  FAIL: exit status $rc, $got of $want lines matching '$pattern'; the log's end ($log):"
    tail -n 30 "$log" | sed 's/^/    /'
  fi
}

skip() {
  skipped=$((skipped + 1))
  echo "gpu-check: $1: SKIPPED ($2)"
}

# ranks N COMMAND...: COMMAND on N ranks under `kolo run`, sharing GPUs when N > GPUs.
ranks() {
  local n=$1
  shift
  if ((n <= gpus)); then
    "$kolo" run -n "$n" -- "$@"
  else
    NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} \
      "$kolo" run -n "$n" -- sh -c \
      'export KOLO_CUDA_DEVICE=$((RANK % '"$gpus"')) NCCL_HOSTID=kolo-gpu-check-$RANK; exec "$@"' \
      sh "$@"
  fi
}
export -f ranks
export kolo gpus nccl_tests conformance gpu_tests matrix KOLO_BACKEND=nccl

top=$((gpus < 4 ? (gpus < 2 ? 2 : gpus) : 4))

check "kolo-nccl tests (GPU world of one)" 1 'nccl engine gpu ok$' \
  '"$nccl_tests" --test-threads 1 --nocapture'
for ((n = 1; n <= top; n++)); do
  check "conformance on NCCL, $n rank(s)" "$n" 'rank [0-9]+: NCCL conformance ok$' \
    "ranks $n \"\$conformance\" --ignored --exact nccl::nccl_rank --nocapture"
done
check "a mismatched call on 2 ranks" 2 'rank [0-9]+: mismatch reported' \
  'KOLO_TIMEOUT=30 ranks 2 "$conformance" --ignored --exact nccl::nccl_mismatch_rank --nocapture'
for n in 1 2; do
  check "GPU tensors on NCCL, $n rank(s)" "$n" 'rank [0-9]+: gpu collectives ok$' \
    "ranks $n \"\$gpu_tests\" --ignored --exact gpu_collectives_rank --nocapture"
  check "DDP with buckets on the GPU, $n rank(s)" "$n" 'rank [0-9]+: gpu ddp ok$' \
    "ranks $n \"\$gpu_tests\" --ignored --exact gpu_ddp_rank --nocapture"
done
check "a mismatched GPU collective on 2 ranks" 2 'rank [0-9]+: gpu mismatch ok' \
  'KOLO_TIMEOUT=30 ranks 2 "$gpu_tests" --ignored --exact gpu_mismatch_rank --nocapture'
check "a peer that exits, 2 ranks" 1 'rank 0: gpu peer loss ok' \
  'KOLO_TIMEOUT=120 ranks 2 "$gpu_tests" --ignored --exact gpu_peer_loss_rank --nocapture'
check "flight record on NCCL: a stuck rank, kolo diagnose" 5 \
  '(rank 0: gpu stuck ok|^2 of 2 ranks left a flight record|collective #[0-9]+: all_reduce f32 × 1,048,576 \(sum|rank 0 waited in it( and failed)?, up to [0-9.]+ s at .*gpu\.rs:[0-9]+|rank 1 never entered collective #[0-9]+: its last completed collective was #[0-9]+ \(all_reduce.*gpu\.rs:[0-9]+)' \
  'd=$(mktemp -d); KOLO_TIMEOUT=10 KOLO_TRACE_DIR=$d ranks 2 "$gpu_tests" --ignored --exact gpu_stuck_rank --nocapture; "$kolo" diagnose "$d"'
for n in 1 2; do
  check "the matrix example on NCCL, $n rank(s)" 2 '(sum: 28|squares: 0 1 4 9 16 25 36 49)$' \
    "ranks $n \"\$matrix\""
done

if [[ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz && -z ${KOLO_DATA_DIR:-} ]]; then
  skip "kolo train --device cuda" "no Fashion-MNIST: scripts/fetch-data.sh"
else
  n=$((gpus < 2 ? 1 : gpus))
  for backend in kolo nccl; do
    check "kolo train --device cuda -n $n, KOLO_BACKEND=$backend, 85 %" 1 \
      'final test accuracy (8[5-9]|9[0-9])\.' \
      "KOLO_BACKEND=$backend \"\$kolo\" train -n $n --device cuda --model lenet --epochs 3 \
         --no-progress --out \"\$(mktemp -d)\""
  done
  # DDP's gradient buckets on the GPU, to NCCL, in kolo train (ranks share GPUs where too few).
  check "kolo train --device cuda, 2 ranks on NCCL, 85 %" 1 'final test accuracy (8[5-9]|9[0-9])\.' \
    'ranks 2 "$kolo" train --worker --device cuda --model lenet --epochs 3 --no-progress \
       --out "$(mktemp -d)"'
fi

echo "gpu-check: $passed passed, $failed failed, $skipped skipped (logs in $logs)"
if ((failed > 0)); then
  printf 'gpu-check: failed: %s\n' "${failures[@]}" >&2
  exit 1
fi
if ((skipped > 0)) && [[ ${CI:-} == true && ${KOLO_ALLOW_SKIPS:-} != 1 ]]; then
  echo "gpu-check: checks were skipped (CI=true; KOLO_ALLOW_SKIPS=1 allows it)" >&2
  exit 1
fi
echo "gpu-check: all passed"
