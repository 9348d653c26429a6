# shellcheck shell=bash
# What the end-to-end scripts share (sourced by e2e.sh and e2e-mpi.sh): a temporary directory, the
# pass/fail counters and their reporting, and a check of the last job's output.

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
skipped=0
out=""
rc=0

# Each report ends with the seconds since the one before (about what that check took), so a slow
# check shows in the suite's log.
_since=$SECONDS
took() {
    _took="$((SECONDS - _since)) s"
    _since=$SECONDS
}

ok() {
    took
    echo "ok - $1 ($_took)"
    passed=$((passed + 1))
}

# fail NAME WHY: reports the failure, with the last job's output indented below it.
fail() {
    took
    echo "FAIL - $1: $2 ($_took)"
    failed=$((failed + 1))
    if [[ -n $out ]]; then
        sed 's/^/#   /' <<<"$out" | tail -n 40
    fi
}

# skip NAME WHY: a check this machine cannot run (no network namespaces, no torchrun), counted.
skip() {
    took
    echo "skip - $1: $2 ($_took)"
    skipped=$((skipped + 1))
}

# finish NAME: prints the totals (skips counted) and exits 1 if a check failed, or if one was
# skipped where every check must run: with KOLO_REQUIRE_ALL=1, or under CI (CI=true) unless
# KOLO_ALLOW_SKIP=1 says this machine may skip (a CI machine must not pass a check silently).
finish() {
    echo "$1: $passed passed, $failed failed, $skipped skipped"
    if ((skipped > 0)); then
        if [[ ${KOLO_REQUIRE_ALL:-} == 1 ]]; then
            echo "$1: $skipped check(s) skipped with KOLO_REQUIRE_ALL=1"
            exit 1
        fi
        if [[ ${CI:-} == true && ${KOLO_ALLOW_SKIP:-} != 1 ]]; then
            echo "$1: $skipped check(s) skipped under CI=true; set KOLO_ALLOW_SKIP=1 where this machine cannot run them (network namespaces need root)"
            exit 1
        fi
    fi
    ((failed == 0)) || exit 1
}

# expect NAME PATTERN...: fails NAME unless $out has a line matching each (extended) pattern.
expect() {
    local name=$1 p
    shift
    for p in "$@"; do
        if ! grep -Eq -- "$p" <<<"$out"; then
            fail "$name" "no line matching: $p"
            return 1
        fi
    done
}
# has_line LINE: the last job printed exactly LINE.
has_line() { grep -qxF -- "$1" <<<"$out"; }

# The pid of the worker of launcher $1 whose environment has RANK=$2 (empty if none).
worker_of_rank() {
    local p
    for p in $(ps --ppid "$1" -o pid= 2>/dev/null); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2"; then
            echo "$p"
            return
        fi
    done
}
