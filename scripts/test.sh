#!/usr/bin/env bash
# The whole kolo test suite, from a fresh machine with Rust installed: installs what it needs (data;
# OpenMPI and libclang for the MPI backend; afl++ for the fuzz targets; PyTorch's torchrun; mdBook),
# then lints (fmt, clippy, docs), builds and checks the book (docs/), runs every unit, integration,
# property and doc test, each fuzz target for a few seconds, the end-to-end launcher checks (kolo run,
# torchrun, srun), and the MPI backend's tests and end-to-end checks under mpirun. Exits non-zero on
# the first failing stage.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() { printf '\n=== %s (at %d s) ===\n' "$*" "$SECONDS"; }

stage "tools"
# A clean build: incremental compilation would only add gigabytes of cache to target/.
export CARGO_INCREMENTAL=0
# From nothing the suite takes about 8 GiB of disk: ~3 GiB of builds under target/ (the engines'
# features on, line tables only) and ~5 GiB for PyTorch's venv (with NVIDIA's libraries). Say so up front
# rather than failing half-way with a compiler's "No space left on device".
free_gib=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
echo "disk: ${free_gib} GiB free here (from nothing the suite takes about 8 GiB)"
if ((free_gib < 4)); then
  echo "test.sh: only ${free_gib} GiB free on $(df -P . | awk 'NR == 2 { print $6 }'); free some space first" >&2
  exit 1
fi
if ! command -v cargo-nextest >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi
cargo --version
cargo nextest --version | head -1

stage "data (for the real-data tests)"
scripts/fetch-data.sh

stage "MPI (OpenMPI and libclang, for the MPI backend)"
SUDO=""
if ((EUID != 0)) && command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi
need=()
for pkg in openmpi-bin libopenmpi-dev libclang-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  $SUDO apt-get update -q >/dev/null
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi
mpirun --version | head -1

stage "torchrun (PyTorch 2.15 from PyPI, for the launcher checks)"
KOLO_TORCHRUN=$(scripts/install-torch.sh)
export KOLO_TORCHRUN
echo "$KOLO_TORCHRUN"

# The engines (MPI, NCCL) are off by default. The suite builds the workspace once, with both
# features on (a build users make too): the lints, the tests, the doc tests and the end-to-end
# binaries share that build, and the engines' tests run with the others. What exists only without
# them (kolo saying an engine is not built in) is linted in kolo alone, and the Python wheel, built
# without them, tests it (tests/test_errors.py); kolo's own unit tests of it run with a plain
# `cargo test -p kolo` (a build of its own: ~80 s here, for two tests).
ENGINE_FEATURES=kolo/mpi,kolo-ddp/mpi,kolo-train/mpi,kolo-cli/mpi,kolo/nccl
ENGINE_CRATES=(-p kolo-mpi -p kolo-nccl -p kolo -p kolo-ddp -p kolo-train -p kolo-cli)

stage "format; the dev profile's host-only crates"
cargo fmt --all -- --check
python3 scripts/check-host-crates.py

stage "clippy (the engines' features on; then kolo without them)"
# One pass over every crate and target with the engines built in (MPI is installed above), and kolo
# alone without them: the only code that exists only then says an engine is not built in.
cargo clippy --workspace --all-targets --locked --features "$ENGINE_FEATURES" -- -D warnings
cargo clippy -p kolo --all-targets --locked -- -D warnings

stage "docs (without and with the engines)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
RUSTDOCFLAGS="-D warnings" cargo doc "${ENGINE_CRATES[@]}" --features "$ENGINE_FEATURES" --no-deps --locked

stage "book: mdbook build docs; its links, anchors, includes, code blocks and commands"
# mdBook is not a Debian package: without one on PATH, install it from crates.io (no default
# features: no server, watcher or search index; about 3.5 minutes on 2 cores). mdBook itself exits 0
# on a missing include and ignores broken links, so scripts/check-book.py checks those, and that every
# code block is an include of a compiled or tested example or a command that names real paths,
# examples, crates, features and options. `mdbook test` is not run: the book's Rust snippets are
# regions of the examples, which `cargo clippy --all-targets` builds and scripts/e2e-examples.sh runs;
# compiling them again with rustdoc would need `-L` to this workspace's build and test nothing more.
if ! command -v mdbook >/dev/null 2>&1; then
  cargo install mdbook --locked --no-default-features --version 0.5.4
fi
mdbook --version
mdbook build docs
python3 scripts/check-book.py
# The benchmark scripts' machine line (scripts/benchhost.py): a busy process shows as a busy core.
python3 scripts/benchhost.py --self-test

stage "tests (unit, integration, property, multi-process; MPI's under mpirun, NCCL's CPU side)"
# `--cargo-profile dev`: the same build as the doc tests and the end-to-end binaries (the test profile
# would compile every dependency a second time). MPI: the conformance matrix under `mpirun -n 1..5`,
# failures, the DDP invariant under `mpirun -n 2`. No GPU here: NCCL's tests check loading, errors
# and the ABI; scripts/gpu-check.sh runs it on one.
cargo nextest run --workspace --locked --profile ci --cargo-profile dev --features "$ENGINE_FEATURES"

stage "doc tests"
cargo test --workspace --doc --locked --features "$ENGINE_FEATURES"

stage "fuzz targets (AFL++): build instrumented, fuzz each for a few seconds"
# Keeps the targets building and running; the corpus and regression inputs of every target were
# replayed by the tests above. Installs Debian's afl++ if needed. The checkpoint target is left out
# here: instrumenting it means building candle instrumented (about 11 minutes on 2 cores).
KOLO_FUZZ_JOBS=2 KOLO_FUZZ_NO_TRAIN=1 scripts/fuzz.sh all 5

stage "end-to-end: kolo run and kolo train with the examples"
# The test build already holds these (same profile settings and features), so this adds little.
cargo build --workspace --bins --examples --locked --features "$ENGINE_FEATURES"
scripts/e2e.sh target/debug
scripts/e2e-examples.sh target/debug
scripts/e2e-diagnose.sh target/debug
scripts/e2e-fault-tolerance.sh target/debug
# The book's and README's `kolo ...` commands against the options of the binary just built.
python3 scripts/check-book.py --kolo target/debug/kolo

stage "end-to-end: the same programs under torchrun and srun"
scripts/e2e-launchers.sh target/debug

stage "Python package: the kolo wheel (maturin) and its tests (pytest; torch backend under torchrun)"
# Built and installed into PyTorch's venv (its torch loads the backend through the package's
# entry point); the dev profile shares the build above. expecttest: torch's distributed test suite
# (tests/test_torch_suite.py runs a few of its tests on kolo) imports it; torchft: kolo as its
# reconfigurable process group (tests/test_torchft.py).
VENV=$(dirname "$(dirname "$KOLO_TORCHRUN")")
"$VENV/bin/pip" install -q --retries 5 "maturin>=1.9.4,<2" pytest expecttest "torchft==0.2.0"
# mpi4py's demo programs (tests/test_mpi_demos.py runs them on kolo.MPI): its source
# distribution, where scripts/osu_mpi4py.py keeps it, so that the demos run here and are not skipped.
MPI4PY_SDIST="${KOLO_CACHE:-$HOME/.cache/kolo}/mpi4py"
[ -f "$MPI4PY_SDIST/mpi4py-4.1.2.tar.gz" ] || "$VENV/bin/pip" download -q --retries 5 --no-binary mpi4py --no-deps \
    -d "$MPI4PY_SDIST" "mpi4py==4.1.2"
rm -rf target/wheels
"$VENV/bin/maturin" build -q -m crates/kolo-py/Cargo.toml --profile dev -o target/wheels
"$VENV/bin/pip" install -q --force-reinstall --no-deps target/wheels/kolo-*.whl
(cd crates/kolo-py && KOLO_BIN="$PWD/../../target/debug/kolo" "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=10 tests)

stage "engines: MPI end-to-end (mpirun matrix, kolo train and bench on MPI)"
# The binaries and examples built for the end-to-end stage above have MPI built in.
scripts/e2e-mpi.sh target/debug

stage "done"
# Not run here: the CUDA training build (about 8 minutes compiling candle's CUDA kernels to PTX, no
# GPU to run it on): scripts/cuda-build-check.sh, and scripts/gpu-check.sh on a GPU machine.
echo "not run here (1): the CUDA training build — scripts/cuda-build-check.sh (no GPU needed, ~8 min)"
echo "target/ holds $(du -sh target 2>/dev/null | cut -f1); $(df -Ph . | awk 'NR == 2 { print $4 }') left free"
