#!/usr/bin/env bash
# Installs PyTorch's launcher, `torchrun` (torch 2.15 from PyPI, CPU use only), into a virtual
# environment for the launcher checks (scripts/e2e-launchers.sh) and the PyTorch peers of
# scripts/bench_train.py (with numpy), and prints its torchrun's path.
#
# Usage: scripts/install-torch.sh      venv: $KOLO_TORCH_VENV, default ~/.cache/kolo/torch-2.15.0
#
# PyPI's Linux wheel of torch pulls in NVIDIA's CUDA libraries (about 5 GB installed, 2-3 minutes
# here); torch cannot be imported without them, and the CPU-only wheel is not on PyPI. An existing
# venv whose torchrun runs is reused.
set -euo pipefail
VERSION=2.15.0
VENV=${KOLO_TORCH_VENV:-$HOME/.cache/kolo/torch-$VERSION}
if "$VENV/bin/torchrun" --help >/dev/null 2>&1; then
    # numpy: the PyTorch DDP LeNet peer (scripts/bench_train.py) reads the data with it.
    "$VENV/bin/python" -c "import numpy" 2>/dev/null \
        || "$VENV/bin/pip" install -q --no-cache-dir --retries 5 numpy >&2 || true
    echo "$VENV/bin/torchrun"
    exit 0
fi
echo "install-torch: installing torch $VERSION into $VENV" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
ok=0
for attempt in 1 2 3; do
    if "$VENV/bin/pip" install -q --no-cache-dir --retries 5 "torch==$VERSION" numpy >&2; then
        ok=1
        break
    fi
    echo "install-torch: pip failed (attempt $attempt of 3)" >&2
    sleep 5
done
if ((!ok)) || ! "$VENV/bin/torchrun" --help >/dev/null 2>&1; then
    echo "install-torch: could not install a working torchrun into $VENV" >&2
    exit 1
fi
echo "$VENV/bin/torchrun"
