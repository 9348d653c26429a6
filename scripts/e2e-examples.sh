#!/usr/bin/env bash
# The compiled DDP examples of crates/kolo-ddp/examples, each run as a user would under
# `kolo run -n 2`, with its outcome asserted (each example also checks its own result and exits
# non-zero when it misses it).
#
# Usage: scripts/e2e-examples.sh [BIN_DIR]    (default target/release)
# Expects BIN_DIR/kolo and BIN_DIR/examples/<example>, built with
#   cargo build --release -p kolo-cli -p kolo-ddp --examples
# Prints `ok - NAME` or `FAIL - NAME: why` per check, then `e2e-examples: N passed, M failed`;
# exits 1 if any check failed. Every job runs under `timeout 300`.
set -euo pipefail

BIN=$(cd "${1:-target/release}" && pwd)
KOLO=$BIN/kolo
EX=$BIN/examples
EXAMPLES=(ddp_minimal)
for f in "$KOLO" "${EXAMPLES[@]/#/$EX/}"; do
    if [[ ! -x $f ]]; then
        echo "e2e-examples: $f is missing; build with: cargo build --release -p kolo-cli -p kolo-ddp --examples" >&2
        exit 2
    fi
done

# shellcheck source=scripts/e2e-lib.sh
source "$(dirname "$0")/e2e-lib.sh"

# job ARGS...: runs `kolo run -n 2 -- ARGS...` (bounded to 300 s) in $TMP; sets $out and $rc.
job() {
    rc=0
    out=$(cd "$TMP" && timeout 300 "$KOLO" run -n 2 -- "$@" 2>&1) || rc=$?
}

check_ddp_minimal() {
    local name="ddp_minimal: 2 ranks, a model built once, loss below 0.6, checkpoints"
    job "$EX/ddp_minimal" 12000 "$TMP/minimal"
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! grep -Eq '^\[rank 0\] epoch 1: mean loss 0\.[0-5]' <<<"$out"; then
        fail "$name" "no epoch 1 loss below 0.6 from rank 0"
        return
    fi
    if [[ $(cat "$TMP/minimal/latest" 2>/dev/null) != epoch-0002 ]]; then
        fail "$name" "no checkpoint epoch-0002 in $TMP/minimal"
        return
    fi
    ok "$name"
}

check_ddp_minimal

echo "e2e-examples: $passed passed, $failed failed"
((failed == 0)) || exit 1
