#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs and puts it, stripped, in DIR, for a GPU machine without
# Rust (a cluster node; the build machine needs no GPU): kolo (with the cuda and nccl features),
# the NCCL conformance and kolo-nccl tests, kolo-ddp's GPU tests, the matrix example. On the GPU
# machine: `scripts/gpu-check.sh --prebuilt DIR`, with CUDA's libraries (cudart, cublas, curand:
# NVIDIA's wheels, or the toolkit) and NCCL on LD_LIBRARY_PATH.
#
# Usage: scripts/gpu-pack.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-pack.sh DIR}
mkdir -p "$out"
command -v nvcc >/dev/null || . scripts/cuda-env.sh
test_exe() { # the test executable of: cargo test --release ARGS
  cargo test --release "$@" --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | tail -1
}
cargo build --release -p kolo-cli --features kolo-cli/cuda,kolo-cli/nccl
cargo build --release -p kolo --features nccl --example matrix
target=${CARGO_TARGET_DIR:-target}
strip -o "$out/kolo" "$target/release/kolo"
strip -o "$out/matrix" "$target/release/examples/matrix"
strip -o "$out/kolo-nccl-tests" "$(test_exe -p kolo-nccl --lib)"
strip -o "$out/conformance" "$(test_exe -p kolo --features nccl --test conformance)"
strip -o "$out/kolo-ddp-gpu" "$(test_exe -p kolo-ddp --features cuda,nccl --test gpu)"
ls -l "$out"
