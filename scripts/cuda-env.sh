# Source this (`. scripts/cuda-env.sh`) to build kolo's CUDA training (`--features kolo-cli/cuda`)
# on a machine without NVIDIA's toolkit: installs CUDA's compiler, headers and CCCL from PyPI into a
# venv ($KOLO_CUDA_VENV, default ~/.cache/kolo/cuda-13.5) when missing, and exports
#
#   PATH                 with that nvcc first (candle's kernels are compiled to PTX by it);
#   CUDA_COMPUTE_CAP     the first GPU's (nvidia-smi), else 90 (H100) — set it to build for others;
#   CUDARC_CUDA_VERSION  13040: the newest CUDA cudarc 0.19 has bindings for (nvcc is 13.5).
#
# No GPU is needed to build; running needs one, its driver, and NCCL for KOLO_BACKEND=nccl.
# A machine with the CUDA toolkit installed needs none of this: nvcc on PATH is enough.
_kolo_cuda_venv=${KOLO_CUDA_VENV:-$HOME/.cache/kolo/cuda-13.5}
_kolo_find_nvcc() { find "$_kolo_cuda_venv" -path '*nvidia/cu13/bin/nvcc' -type f 2>/dev/null | head -1 || true; }
_kolo_nvcc=$(_kolo_find_nvcc)
if [[ -z $_kolo_nvcc ]]; then
  echo "cuda-env: installing CUDA 13.5's nvcc, headers and CCCL into $_kolo_cuda_venv" >&2
  python3 -m venv "$_kolo_cuda_venv" &&
    "$_kolo_cuda_venv/bin/pip" install -q --no-cache-dir --retries 5 \
      nvidia-cuda-nvcc==13.5.37 nvidia-cuda-crt==13.5.37 nvidia-cuda-runtime==13.5.37 \
      nvidia-cuda-cccl==13.3.5.0.6 >&2
  _kolo_nvcc=$(_kolo_find_nvcc)
fi
if [[ -n $_kolo_nvcc ]]; then
  export PATH="$(dirname "$_kolo_nvcc"):$PATH"
  _kolo_cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.' || true)
  export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-${_kolo_cap:-90}}
  export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13040}
  echo "cuda-env: $("$_kolo_nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p'), compute capability $CUDA_COMPUTE_CAP" >&2
else
  echo "cuda-env: could not install nvcc into $_kolo_cuda_venv" >&2
fi
unset -f _kolo_find_nvcc
unset _kolo_cuda_venv _kolo_nvcc _kolo_cap
