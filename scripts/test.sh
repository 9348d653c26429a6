#!/usr/bin/env bash
# The whole kolo test suite, from a fresh machine with Rust installed: installs what it needs, then
# lints (fmt, clippy, docs), runs every unit, integration, property and doc test, and the end-to-end
# launcher checks with the release binaries. Exits non-zero on the first failing stage.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() { printf '\n=== %s ===\n' "$*"; }

stage "tools"
if ! command -v cargo-nextest >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi
cargo --version
cargo nextest --version | head -1

stage "data (for the real-data tests)"
scripts/fetch-data.sh

stage "format"
cargo fmt --all -- --check

stage "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

stage "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

stage "tests (unit, integration, property, multi-process)"
# `--cargo-profile dev`: the same build as the doc tests and the end-to-end binaries (the test profile
# would compile every dependency a second time).
cargo nextest run --workspace --locked --profile ci --cargo-profile dev

stage "doc tests"
cargo test --workspace --doc --locked

stage "end-to-end: kolo run and kolo train with the examples"
# The test build already holds these (same profile settings), so this adds little.
cargo build --workspace --bins --examples --locked
scripts/e2e.sh target/debug
