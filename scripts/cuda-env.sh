# Source this (`. scripts/cuda-env.sh`) to build kolo's CUDA training (`--features kolo-cli/cuda`)
# on a machine without NVIDIA's toolkit: installs CUDA's compiler, headers and CCCL from PyPI into a
# venv ($KOLO_CUDA_VENV, default ~/.cache/kolo/cuda-13.0) when missing, and exports
#
#   PATH                 with that nvcc first (candle's kernels are compiled to PTX by it);
#   CUDA_COMPUTE_CAP     the first GPU's (nvidia-smi), else 90 (H100) — set it to build for others;
#   CUDARC_CUDA_VERSION  13000, the toolkit's;
#   CUDA_HOME            a folder the linker finds CUDA's libraries in: candle links cudart,
#                        nvrtc, curand, cublas and cublasLt (from the same wheels) and the driver,
#                        libcuda, for which it holds a stub made from cuda.h (the driver itself is
#                        loaded at run time, on the machine with the GPU).
#
# CUDA 13.0 on purpose: the driver JIT-compiles candle's PTX when a kernel is first loaded, and a
# driver older than the nvcc that wrote it refuses it (CUDA_ERROR_UNSUPPORTED_PTX_VERSION). PTX from
# 13.0 loads on every CUDA 13 driver (580 and later).
#
# CUDA_ENV_LINK=0 leaves out what only linking needs (the libraries' wheels, about 700 MB, and
# the stub), for checks that compile without linking (cargo check, clippy).
#
# No GPU is needed to build; running needs one, its driver, and NCCL for KOLO_BACKEND=nccl.
# A machine with the CUDA toolkit installed needs none of this: nvcc on PATH is enough.
_kolo_cuda_venv=${KOLO_CUDA_VENV:-$HOME/.cache/kolo/cuda-13.0}
_kolo_find_nvcc() { find "$_kolo_cuda_venv" -path '*nvidia/cu13/bin/nvcc' -type f 2>/dev/null | head -1 || true; }
_kolo_nvcc=$(_kolo_find_nvcc)
if [[ -z $_kolo_nvcc ]]; then
  echo "cuda-env: installing CUDA 13.0's nvcc, headers and CCCL into $_kolo_cuda_venv" >&2
  python3 -m venv "$_kolo_cuda_venv" &&
    "$_kolo_cuda_venv/bin/pip" install -q --no-cache-dir --retries 5 \
      nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 \
      nvidia-cuda-cccl==13.0.85 >&2
  _kolo_nvcc=$(_kolo_find_nvcc)
fi
if [[ -n $_kolo_nvcc ]]; then
  export PATH="$(dirname "$_kolo_nvcc"):$PATH"
  _kolo_cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.' || true)
  export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-${_kolo_cap:-90}}
  export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}
  _kolo_cu13=$(dirname "$(dirname "$_kolo_nvcc")")
  if [[ ${CUDA_ENV_LINK:-1} != 0 && ! -e $_kolo_cu13/lib/libcublas.so.13 ]]; then
    echo "cuda-env: installing the CUDA 13.0 libraries candle links (cublas, curand, nvrtc)" >&2
    "$_kolo_cuda_venv/bin/pip" install -q --no-cache-dir --retries 5 nvidia-cuda-nvrtc==13.0.88 \
      nvidia-curand==10.4.0.35 nvidia-cublas==13.0.2.14 >&2
  fi
  if [[ ${CUDA_ENV_LINK:-1} != 0 ]]; then
    export CUDA_HOME="$_kolo_cuda_venv/cuda-home"
  fi
  if [[ ${CUDA_ENV_LINK:-1} != 0 && ! -e $CUDA_HOME/lib/stubs/libcuda.so ]]; then
    mkdir -p "$CUDA_HOME/lib/stubs"
    for _kolo_l in cudart nvrtc curand cublas cublasLt; do
      ln -sf "$(ls "$_kolo_cu13/lib/lib$_kolo_l.so."* | head -1)" "$CUDA_HOME/lib/lib$_kolo_l.so"
    done
    # Every driver function cuda.h declares (after its #defines: cuMemAlloc is cuMemAlloc_v2).
    gcc -E -P "$_kolo_cu13/include/cuda.h" | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' |
      tr -d '( ' | sort -u | sed 's/.*/void &(void) {}/' >"$CUDA_HOME/lib/stubs/libcuda.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CUDA_HOME/lib/stubs/libcuda.so" \
      "$CUDA_HOME/lib/stubs/libcuda.c"
  fi
  echo "cuda-env: $("$_kolo_nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p'), compute capability $CUDA_COMPUTE_CAP" >&2
else
  echo "cuda-env: could not install nvcc into $_kolo_cuda_venv" >&2
fi
unset -f _kolo_find_nvcc
unset _kolo_cuda_venv _kolo_nvcc _kolo_cap _kolo_cu13 _kolo_l
