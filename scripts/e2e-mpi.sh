#!/usr/bin/env bash
# End-to-end checks of kolo on the MPI backend, with OpenMPI's mpirun.
#
# Usage: scripts/e2e-mpi.sh [BIN_DIR]    (default target/release)
# Expects BIN_DIR/kolo and BIN_DIR/examples/matrix built with the MPI backend:
#   cargo build --release -p kolo-cli -p kolo --bins --examples --features kolo-cli/mpi,kolo/mpi
# Prints `ok - NAME` or `FAIL - NAME: why` per check, then `e2e-mpi: N passed, M failed`; exits 1 if
# any check failed. Every job runs under a timeout.
set -euo pipefail

BIN=${1:-target/release}
KOLO=$BIN/kolo
EX=$BIN/examples
for f in "$KOLO" "$EX/matrix" "$EX/stuck_rank"; do
    if [[ ! -x $f ]]; then
        echo "e2e-mpi: $f is missing; build with: cargo build --release -p kolo-cli -p kolo --bins --examples --features kolo-cli/mpi,kolo/mpi" >&2
        exit 2
    fi
done
command -v mpirun >/dev/null || { echo "e2e-mpi: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 2; }

# shellcheck source=scripts/e2e-lib.sh
source "$(dirname "$0")/e2e-lib.sh"

MPIRUN=(mpirun --oversubscribe)
if ((EUID == 0)); then MPIRUN+=(--allow-run-as-root); fi

# run SECS CMD...: runs CMD with a timeout; sets $out (stdout and stderr) and $rc. mpirun can stay
# after its ranks are gone and ignore the SIGTERM of the timeout (seen once after the stuck-rank
# job): it is killed 10 s later.
run() {
    local secs=$1
    shift
    rc=0
    out=$(timeout -k 10 "$secs" "$@" 2>&1) || rc=$?
}

check_matrix() {
    local name=$1
    shift
    run 60 "$@"
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! has_line "sum: 28"; then fail "$name" "no 'sum: 28'"; return; fi
    if ! has_line "squares: 0 1 4 9 16 25 36 49"; then fail "$name" "no squares"; return; fi
    ok "$name"
}

# accuracy_at_least PCT: the final test accuracy in $out is at least PCT.
accuracy_at_least() {
    local acc
    acc=$(sed -n 's/.*final test accuracy \([0-9.]*\)%.*/\1/p' <<<"$out")
    [[ -n $acc ]] && awk -v a="$acc" -v m="$1" 'BEGIN { exit !(a >= m) }'
}

check_train() {
    local name=$1 dir=$2
    shift 2
    run 300 "$@" --model mlp --dataset digits --epochs 4 --batch-size 32 --lr 0.05 --no-progress --out "$dir"
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! accuracy_at_least 85; then fail "$name" "final accuracy below 85%"; return; fi
    if ! grep -q "transport mpi" <<<"$out" && ! grep -q "backend mpi" <<<"$out"; then
        fail "$name" "the job did not report running on MPI"
        return
    fi
    local f
    for f in metrics.csv training.png summary.json checkpoints/latest; do
        if [[ ! -e $dir/$f ]]; then fail "$name" "$f was not written"; return; fi
    done
    ok "$name"
}

check_bench() {
    local name="kolo bench allreduce --backend mpi: impl kolo-mpi, no wrong element"
    run 120 "$KOLO" bench allreduce --backend mpi -n 2 --sizes 4,64K,1M --json
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if (($(grep -c '"impl":"kolo-mpi","op":"allreduce","n":2' <<<"$out") != 3)); then
        fail "$name" "expected 3 kolo-mpi rows"
        return
    fi
    if grep -q '"wrong":[1-9]' <<<"$out"; then fail "$name" "wrong elements"; return; fi
    ok "$name"
}

check_mismatch() {
    local name="a rank that fails ends the MPI job with an error naming it"
    # matrix refuses a world of 3 on every rank; under mpirun that must end the job, not hang.
    run 60 "${MPIRUN[@]}" -n 3 "$EX/matrix"
    if ((rc == 0)); then fail "$name" "exit code 0"; return; fi
    if ((rc == 124 || rc == 137)); then fail "$name" "timed out"; return; fi
    if ! grep -q "world size 3" <<<"$out"; then fail "$name" "no message naming world size 3"; return; fi
    ok "$name"
}

check_diagnose() {
    local name="kolo diagnose on MPI: a stuck rank under mpirun, named with its last call"
    run 60 "${MPIRUN[@]}" -n 3 -x KOLO_TIMEOUT=3 -x KOLO_TRACE_DIR="$TMP/trace" "$EX/stuck_rank"
    if ((rc == 0 || rc == 124)); then fail "$name" "exit code $rc"; return; fi
    run 60 "$KOLO" diagnose "$TMP/trace"
    if ((rc != 0)); then fail "$name" "kolo diagnose exited with $rc"; return; fi
    if ! grep -q "^3 of 3 ranks left a flight record" <<<"$out" ||
        ! grep -q "collective #10: all_reduce f32 × 65,536 (sum, engine)" <<<"$out" ||
        ! grep -Eq "rank 2 never entered collective #10: .*stuck_rank.rs:28:" <<<"$out"; then
        fail "$name" "kolo diagnose did not name rank 2 and collective #10"
        return
    fi
    ok "$name"
}

check_matrix "mpirun -n 2 matrix" "${MPIRUN[@]}" -n 2 "$EX/matrix"
check_matrix "mpirun -n 4 matrix" "${MPIRUN[@]}" -n 4 "$EX/matrix"
check_matrix "kolo run --backend mpi -n 4 matrix" "$KOLO" run --backend mpi -n 4 -- "$EX/matrix"
check_mismatch
check_train "mpirun -n 2 kolo train --worker: digits MLP on MPI" "$TMP/train-mpirun" \
    "${MPIRUN[@]}" -n 2 "$KOLO" train --worker
check_train "kolo train --backend mpi -n 2: digits MLP on MPI" "$TMP/train-backend" \
    "$KOLO" train --backend mpi -n 2
check_bench
check_diagnose

finish e2e-mpi
