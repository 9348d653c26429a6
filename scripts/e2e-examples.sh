#!/usr/bin/env bash
# The compiled DDP examples of crates/kolo-ddp/examples, each run as a user would under
# `kolo run -n 2`, with its outcome asserted (each example also checks its own result and exits
# non-zero when it misses it).
#
# Usage: scripts/e2e-examples.sh [BIN_DIR]    (default target/release)
# Expects BIN_DIR/kolo and BIN_DIR/examples/<example>, built with
#   cargo build --release -p kolo-cli -p kolo-ddp --bins --examples
# Prints `ok - NAME` or `FAIL - NAME: why` per check, then `e2e-examples: N passed, M failed`;
# exits 1 if any check failed. Every job runs under `timeout 300`.
set -euo pipefail

BIN=$(cd "${1:-target/release}" && pwd)
KOLO=$BIN/kolo
EX=$BIN/examples
EXAMPLES=(ddp_minimal ddp_hooks ddp_join zero transformer_lm)
for f in "$KOLO" "${EXAMPLES[@]/#/$EX/}"; do
    if [[ ! -x $f ]]; then
        echo "e2e-examples: $f is missing; build with: cargo build --release -p kolo-cli -p kolo-ddp --bins --examples" >&2
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
    local name="ddp_minimal: 2 ranks, a model built once, loss below 0.6, checkpoints, test accuracy over 75 % on all 10,000 test images, no flight record"
    KOLO_TRACE_DIR="$TMP/minimal-trace" job "$EX/ddp_minimal" 12000 "$TMP/minimal"
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    # A clean run leaves no flight record: every rank closed its transport before it exited.
    if [[ -n $(ls -A "$TMP/minimal-trace" 2>/dev/null) ]] || grep -q "flight record" <<<"$out"; then
        fail "$name" "a clean run left a flight record: $(grep -m1 "flight record" <<<"$out")"
        return
    fi
    if ! grep -Eq '^\[rank 0\] epoch 1: mean loss 0\.[0-5]' <<<"$out"; then
        fail "$name" "no epoch 1 loss below 0.6 from rank 0"
        return
    fi
    if ! grep -Eq '^\[rank 0\] test accuracy (7[5-9]|[89][0-9])\.[0-9]+ % of 10000$' <<<"$out"; then
        fail "$name" "no test accuracy over 75 % of 10000 images from rank 0"
        return
    fi
    if [[ $(cat "$TMP/minimal/latest" 2>/dev/null) != epoch-0002 ]]; then
        fail "$name" "no checkpoint epoch-0002 in $TMP/minimal"
        return
    fi
    ok "$name"
}

check_threads() {
    local name="kolo run -n 2: each worker's RAYON_NUM_THREADS and OMP_NUM_THREADS are its CPU count"
    # shellcheck disable=SC2016
    job sh -c 'test "$RAYON_NUM_THREADS" = "$(nproc)" && test "$OMP_NUM_THREADS" = "$(nproc)" && echo sized'
    if ((rc != 0)) || [[ $(grep -c 'sized$' <<<"$out") != 2 ]]; then
        fail "$name" "exit code $rc"
        return
    fi
    ok "$name"
}

check_transformer_lm() {
    local name="transformer_lm: tied embeddings, AdamW, clipping; loss below 2.75 in 150 steps"
    job "$EX/transformer_lm" --steps 150 --target 2.75
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! grep -Eq '^\[rank 0\] final loss [0-2]\.' <<<"$out"; then
        fail "$name" "no final loss below 3 from rank 0"
        return
    fi
    ok "$name"
    name="transformer_lm --bf16: bf16 compute with f32 master weights; loss below 4.2 in 15 steps"
    job "$EX/transformer_lm" --steps 15 --bf16 --target 4.2
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    ok "$name"
}

check_ddp_hooks() {
    local name="ddp_hooks: a custom hook over bf16 compression sends 2 bytes a parameter, ranks agree"
    job "$EX/ddp_hooks" 8000
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! grep -q 'same parameters on every rank: true$' <<<"$out"; then
        fail "$name" "rank 0 did not report equal parameters"
        return
    fi
    ok "$name"
}

check_ddp_join() {
    local name="ddp_join: uneven shards (1/3, 2/3), rank 0 joins and shadows, ranks agree"
    job "$EX/ddp_join" 12000
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! grep -Eq '^\[rank 0\] [0-9]+ batches of its own, [0-9]+ steps in all \([1-9][0-9]* shadowed\)' <<<"$out"; then
        fail "$name" "rank 0 shadowed no step"
        return
    fi
    ok "$name"
}

check_zero() {
    local name="zero: sharded AdamW state, checkpoint, resume ends where uninterrupted training ends"
    job "$EX/zero" 8000 "$TMP/zero"
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if [[ $(grep -c 'resumed == uninterrupted: true; ranks agree: true' <<<"$out") != 2 ]]; then
        fail "$name" "the ranks did not both report an exact resume"
        return
    fi
    ok "$name"
}

check_ddp_minimal
check_ddp_hooks
check_ddp_join
check_zero
check_threads
check_transformer_lm

finish e2e-examples
