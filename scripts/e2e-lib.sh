# shellcheck shell=bash
# What the end-to-end scripts share (sourced by e2e.sh and e2e-mpi.sh): a temporary directory, the
# pass/fail counters and their reporting, and a check of the last job's output.

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
out=""
rc=0

ok() {
    echo "ok - $1"
    passed=$((passed + 1))
}

# fail NAME WHY: reports the failure, with the last job's output indented below it.
fail() {
    echo "FAIL - $1: $2"
    failed=$((failed + 1))
    if [[ -n $out ]]; then
        sed 's/^/#   /' <<<"$out" | tail -n 40
    fi
}

# has_line LINE: the last job printed exactly LINE.
has_line() { grep -qxF -- "$1" <<<"$out"; }
