#!/usr/bin/env bash
# The CUDA training build without a GPU: clippy on kolo train --device cuda with NCCL (kolo-cli's
# cuda and nccl features and the crates under them), with nvcc from PyPI (scripts/cuda-env.sh).
# Compiles candle's CUDA kernels to PTX: about 8 minutes on 2 cores, which is why scripts/test.sh
# leaves it out; run it after changing code behind the `cuda` feature. On a GPU machine,
# scripts/gpu-check.sh builds the same and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
# nvcc and CUDARC_CUDA_VERSION stay in this script's environment.
CUDA_ENV_LINK=0 . scripts/cuda-env.sh
cargo clippy -p kolo-cli -p kolo-nn -p kolo-models -p kolo-ddp -p kolo-train \
  --features kolo-cli/cuda,kolo-cli/nccl --all-targets --locked -- -D warnings
echo "cuda-build-check: the CUDA training build is clean"
