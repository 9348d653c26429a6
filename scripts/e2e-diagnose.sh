#!/usr/bin/env bash
# The flight recorder and `kolo diagnose` as a user meets them: a job under `kolo run` in which
# one rank gets stuck in its own code (crates/kolo/examples/stuck_rank.rs).
#
#   1. after the others time out, kolo run names the records' directory, every rank (the stuck
#      one too) left its record, and kolo diagnose names the collective, the rank that never
#      entered it with its last call's source line, and the ranks that waited;
#   2. while the job still hangs, `kolo diagnose --live PID` (SIGUSR1 through kolo run) shows the
#      same without stopping it.
#
# Usage: scripts/e2e-diagnose.sh [BIN_DIR]    (default target/release)
# Expects BIN_DIR/kolo and BIN_DIR/examples/stuck_rank (cargo build -p kolo-cli -p kolo --bins --examples).
set -euo pipefail

BIN=$(cd "${1:-target/release}" && pwd)
KOLO=$BIN/kolo
EX=$BIN/examples
for f in "$KOLO" "$EX/stuck_rank"; do
    if [[ ! -x $f ]]; then
        echo "e2e-diagnose: $f is missing; build with: cargo build -p kolo-cli -p kolo --bins --examples" >&2
        exit 2
    fi
done

# shellcheck source=scripts/e2e-lib.sh
source "$(dirname "$0")/e2e-lib.sh"

check_after_failure() {
    local name="kolo diagnose after a hang: the stuck rank, its last call, the ranks that waited"
    rc=0
    out=$(cd "$TMP" && KOLO_TIMEOUT=3 KOLO_TRACE_DIR="$TMP/trace" timeout 60 \
        "$KOLO" run -n 3 -- "$EX/stuck_rank" 2>&1) || rc=$?
    if ((rc == 0)); then fail "$name" "the job succeeded"; return; fi
    expect "$name" "kolo run: flight records of 3 of this node's 3 workers are in $TMP/trace" || return
    local job=$out
    rc=0
    out=$("$KOLO" diagnose "$TMP/trace" 2>&1) || rc=$?
    if ((rc != 0)); then fail "$name" "kolo diagnose exited with $rc"; return; fi
    expect "$name" "^3 of 3 ranks left a flight record" \
        "collective #10: all_reduce f32 × 65,536 \(sum" \
        "ranks 0, 1 waited in it( and failed)?, up to 3\.[0-9] s at .*stuck_rank.rs:27:" \
        "rank 2 never entered collective #10: its last completed collective was #9 \(barrier.*stuck_rank.rs:28:" || {
        sed 's/^/#   job: /' <<<"$job" | tail -n 8
        return
    }
    ok "$name"
}

check_live() {
    local name="kolo diagnose --live: a job that hangs, looked at without stopping it"
    local log=$TMP/live.log
    (cd "$TMP" && KOLO_TIMEOUT=120 KOLO_TRACE_DIR="$TMP/live" exec "$KOLO" run -n 3 -- \
        "$EX/stuck_rank" >"$log" 2>&1) &
    local job=$!
    sleep 3
    rc=0
    out=$(timeout 30 "$KOLO" diagnose --live "$job" 2>&1) || rc=$?
    local running=yes
    kill -0 "$job" 2>/dev/null || running=no
    kill -TERM "$job" 2>/dev/null || true
    wait "$job" 2>/dev/null || true
    if ((rc != 0)); then fail "$name" "kolo diagnose exited with $rc"; return; fi
    if [[ $running != yes ]]; then fail "$name" "the job stopped when asked for its records"; return; fi
    expect "$name" "^3 of 3 ranks left a flight record" \
        "ranks 0, 1 waited in it, up to [0-9.]+ s at .*stuck_rank.rs:27:" \
        "rank 2 never entered collective #10" || return
    ok "$name"
}

check_after_failure
check_live

finish e2e-diagnose
