#!/usr/bin/env bash
# kolo's main job from a fresh machine with Rust installed. Until `kolo train` lands, the main job is the
# `matrix` example (scatter, all-reduce, all-gather) on 4 workers started by `kolo run`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --workspace --bins --examples
exec target/release/kolo run -n "${KOLO_WORKERS:-4}" -- target/release/examples/matrix
