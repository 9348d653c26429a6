#!/usr/bin/env bash
# Fault-tolerant training as a user meets it: `kolo train --fault-tolerant` with workers SIGKILLed
# while it trains (kolo::elastic; the launcher restarts only the killed worker).
#
#   1. shared memory, rank 1 killed in epoch 2: the job goes on, the worker rejoins, and the final
#      accuracy is within 1 point of the same run undisturbed; metrics.csv holds every epoch;
#   2. TCP, rank 0 killed (the store lives in the launcher, so the job outlives rank 0);
#   3. two workers killed at once with no restarts left: the last one trains on alone, exit 0;
#   4. a floor (--min-workers 3) that a loss breaks: every survivor stops with the floor's message;
#   5. settings it refuses up front;
#   6. a loop of one's own (crates/kolo-ddp/examples/ddp_fault_tolerant.rs) under
#      `kolo run --restart-workers`, rank 1 killed: it finishes with the loss it must reach;
#   7. two hosts (network namespaces, 2 workers each) and the link between them cut mid-job: the
#      host with the store trains on with its 2 workers and finishes, the other stops (needs root).
#
# Usage: scripts/e2e-fault-tolerance.sh [BIN_DIR]    (default target/release)
# Expects BIN_DIR/kolo and BIN_DIR/examples/ddp_fault_tolerant
# (cargo build -p kolo-cli -p kolo-ddp --bins --examples).
set -euo pipefail

BIN=$(cd "${1:-target/release}" && pwd)
KOLO=$BIN/kolo
EXAMPLE=$BIN/examples/ddp_fault_tolerant
for f in "$KOLO" "$EXAMPLE"; do
    if [[ ! -x $f ]]; then
        echo "e2e-fault-tolerance: $f is missing; build with: cargo build -p kolo-cli -p kolo-ddp --bins --examples" >&2
        exit 2
    fi
done

# shellcheck source=scripts/e2e-lib.sh
source "$(dirname "$0")/e2e-lib.sh"

ARGS=(train -n 3 --model mlp --dataset mnist --train-limit 30000 --test-limit 2000 --epochs 3
    --batch-size 32 --lr 0.05 --no-progress)

# accuracy: the final accuracy (percent) the last job's summary.json in $1 holds.
accuracy() {
    python3 -c 'import json,sys; print(round(100 * json.load(open(sys.argv[1]))["final_accuracy"], 2))' "$1/summary.json" 2>/dev/null
}

# train_and_kill DIR AFTER RANKS EXTRA...: runs kolo train "${ARGS[@]}" EXTRA... into DIR and, once
# the log has a line matching AFTER, SIGKILLs the workers of RANKS (space-separated) at once; sets
# rc and out. Empty RANKS: no kill.
train_and_kill() {
    local dir=$1 after=$2 ranks=$3
    shift 3
    local log=$dir.log
    timeout 300 "$KOLO" "${ARGS[@]}" --out "$dir" "$@" >"$log" 2>&1 &
    local tpid=$! launcher="" i r pids=()
    if [[ -n $ranks ]]; then
        for i in $(seq 1200); do
            grep -Eq -- "$after" "$log" 2>/dev/null && break
            sleep 0.05
        done
        sleep 0.5
        launcher=$(ps --ppid "$tpid" -o pid= 2>/dev/null | tr -d ' ' || true)
        for r in $ranks; do
            [[ -n $launcher ]] && pids+=("$(worker_of_rank "$launcher" "$r")")
        done
        [[ ${#pids[@]} -gt 0 ]] && kill -9 "${pids[@]}" 2>/dev/null || true
    fi
    rc=0
    wait "$tpid" || rc=$?
    out=$(cat "$log")
}

# within_a_point A B: |A - B| <= 1.
within_a_point() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(d <= 1 && d >= -1) }'; }

calm=""

check_lost_and_rejoined() {
    local transport=$1 victim=$2
    local name="kolo train --fault-tolerant ($transport): rank $victim killed in epoch 2, the others go on and it rejoins"
    if [[ -z $calm ]]; then
        train_and_kill "$TMP/calm" "" "" --fault-tolerant
        calm=$(accuracy "$TMP/calm")
        if ((rc != 0)) || [[ -z $calm ]]; then fail "$name" "the undisturbed run failed (exit $rc)"; return; fi
    fi
    KOLO_TRANSPORT=$transport train_and_kill "$TMP/ft-$transport" "^(\[rank [0-9]\] )?epoch 1/3" "$victim" \
        --fault-tolerant --max-restarts 2
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    expect "$name" "worker rank $victim failed \(killed by signal 9 \(SIGKILL\)\); restarting it alone" \
        "generation [0-9]+: 2 workers \(lost members \[[0-9]+\]\)|generation [0-9]+: 3 workers \(lost members \[[0-9]+\], joined members \[4\]\)" \
        "generation [0-9]+: 3 workers \(.*joined members \[4\]\)" \
        "epoch 3/3: .* 3 workers" || return
    local acc
    acc=$(accuracy "$TMP/ft-$transport")
    if [[ -z $acc ]] || ! within_a_point "$acc" "$calm"; then
        fail "$name" "final accuracy ${acc}% vs ${calm}% undisturbed"
        return
    fi
    # kolo train's outputs, written by whichever worker is rank 0 at each epoch's end (on TCP the
    # original rank 0 is the one killed): every epoch's row, the plot, a checkpoint.
    local dir=$TMP/ft-$transport rows=0
    [[ -f $dir/metrics.csv ]] && rows=$(($(wc -l <"$dir/metrics.csv") - 1))
    if ((rows != 3)) || [[ ! -s $dir/training.png || ! -e $dir/checkpoints/latest ]]; then
        fail "$name" "outputs: metrics.csv holds $rows epoch row(s), not 3; or no training.png or checkpoint"
        return
    fi
    ok "$name (accuracy ${acc}% vs ${calm}% undisturbed)"
}

check_two_at_once() {
    local name="kolo train --fault-tolerant: ranks 1 and 2 killed at once, no restarts left, rank 0 trains on alone"
    train_and_kill "$TMP/two" "^epoch 1/3" "1 2" --fault-tolerant --max-restarts 0
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    expect "$name" "worker rank 1 failed .*no restarts left" "worker rank 2 failed .*no restarts left" \
        "generation 1: 1 workers \(lost members \[[0-9]+, [0-9]+\]\)" "epoch 3/3: .* 1 workers" || return
    ok "$name"
}

check_floor() {
    local name="kolo train --fault-tolerant --min-workers 3: a loss below the floor stops every survivor, naming it"
    train_and_kill "$TMP/floor" "^epoch 1/3" "2" --fault-tolerant --min-workers 3 --max-restarts 0
    if ((rc == 0)); then fail "$name" "the job succeeded below its floor"; return; fi
    expect "$name" "worker 0: .*only 2 live worker\(s\).*fewer than the floor of 3 \(--min-workers\)" \
        "worker 1: .*fewer than the floor of 3" || return
    ok "$name"
}

check_refusals() {
    local name="kolo train --fault-tolerant refuses what it cannot keep"
    rc=0
    out=$("$KOLO" "${ARGS[@]}" --fault-tolerant --min-workers 4 2>&1) || rc=$?
    if ((rc == 0)); then fail "$name" "--min-workers 4 with 3 workers was accepted"; return; fi
    expect "$name" "--min-workers 4 is more than the 3 workers" || return
    rc=0
    out=$("$KOLO" "${ARGS[@]}" --fault-tolerant --shard-optimizer --out "$TMP/zero" 2>&1) || rc=$?
    if ((rc == 0)); then fail "$name" "--shard-optimizer was accepted"; return; fi
    expect "$name" "shard-optimizer.*cannot be combined with --fault-tolerant: a lost worker takes its shard" || return
    ok "$name"
}

check_own_loop() {
    local name="a loop of one's own (ElasticWorld + kolo_ddp::elastic::handover) under kolo run --restart-workers, rank 1 killed"
    local log=$TMP/own.log
    timeout 300 "$KOLO" run -n 3 --restart-workers --max-restarts 2 -- "$EXAMPLE" 30000 >"$log" 2>&1 &
    local tpid=$! i launcher victim=""
    for i in $(seq 1200); do
        grep -q "epoch 0: mean loss" "$log" 2>/dev/null && break
        sleep 0.05
    done
    sleep 0.3
    launcher=$(ps --ppid "$tpid" -o pid= 2>/dev/null | tr -d ' ' || true)
    [[ -n $launcher ]] && victim=$(worker_of_rank "$launcher" 1)
    [[ -n $victim ]] && kill -9 "$victim"
    rc=0
    wait "$tpid" || rc=$?
    out=$(cat "$log")
    if [[ -z $victim ]]; then fail "$name" "no rank 1 to kill"; return; fi
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    expect "$name" "worker rank 1 failed .*restarting it alone" "generation [0-9]+: [23] workers" \
        "done: last epoch's mean loss 0\.[0-5]" || return
    ok "$name"
}

check_partition() {
    local name="two hosts, the link cut mid-job: the side with the store trains on and finishes, the other stops"
    local here
    here=$(cd "$(dirname "$0")" && pwd)
    rc=0
    out=$("$here/netns-partition.sh" "$KOLO" 2 "epoch 1/4" -- train --fault-tolerant --model mlp \
        --dataset mnist --train-limit 20000 --test-limit 2000 --epochs 4 --batch-size 32 \
        --no-progress --out "$TMP/partition" 2>&1) || rc=$?
    if ((rc == 77)); then
        skip "$name" "$(tail -1 <<<"$out")"
        return
    fi
    if ((rc != 0)); then fail "$name" "netns-partition.sh: exit code $rc"; return; fi
    expect "$name" "^partition: node 0 exit 0 after" "^partition: node 1 exit 1 after" \
        "\[node 0\] kolo train: generation 1: 2 workers \(lost members \[[0-9]+, [0-9]+\]\)" \
        "\[node 0\] epoch 4/4: .* 2 workers" "\[node 1\] kolo run: stopping workers: lost the rendezvous store" || return
    ok "$name"
}

check_lost_and_rejoined shm 1
check_lost_and_rejoined tcp 0
check_two_at_once
check_floor
check_refusals
check_own_loop
check_partition

finish e2e-fault-tolerance
