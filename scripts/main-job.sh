#!/usr/bin/env bash
# kolo's main job from a fresh machine with Rust installed: installs the data (Debian's
# dataset-fashion-mnist, MNIST and digits), builds kolo, and runs `kolo train` — by default LeNet on
# Fashion-MNIST with 2 workers for 10 epochs. Extra arguments go to `kolo train` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-data.sh
# A font for the text of the training plot (the plot is drawn without text if none is found).
if [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] && command -v apt-get >/dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get install -y -q fonts-dejavu-core >/dev/null 2>&1 ||
    { $sudo apt-get update -q >/dev/null 2>&1 && $sudo apt-get install -y -q fonts-dejavu-core >/dev/null 2>&1; } ||
    echo "main-job: could not install fonts-dejavu-core; the plot will have no text" >&2
fi
cargo build --release --locked -p kolo-cli
exec target/release/kolo train "$@"
