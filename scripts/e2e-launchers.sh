#!/usr/bin/env bash
# End-to-end checks of kolo programs under other launchers, unchanged: the real `torchrun`
# (PyTorch's; one node, a c10d rendezvous, two hosts in network namespaces, restarts, failures) and
# SLURM's `srun` (scripts/fake-srun, a stand-in that sets SLURM's variables only), plus the errors a
# bad launcher environment gives.
#
# Usage: scripts/e2e-launchers.sh [BIN_DIR]    (default target/release)
# torchrun: $KOLO_TORCHRUN, else the one scripts/install-torch.sh installs, else torchrun on PATH;
# without one the torchrun checks are skipped, unless KOLO_TORCHRUN is set (then a missing torchrun
# fails). Prints `ok - NAME`, `skip - NAME: why` or `FAIL - NAME: why`, then
# `e2e-launchers: N passed, M failed`; exits 1 if any check failed.
set -euo pipefail

BIN=${1:-target/release}
KOLO=$BIN/kolo
EX=$BIN/examples
here=$(cd "$(dirname "$0")" && pwd)
for f in "$KOLO" "$EX/matrix" "$EX/ring_allreduce"; do
    if [[ ! -x $f ]]; then
        echo "e2e-launchers: $f is missing; build with: cargo build -p kolo-cli -p kolo --bins --examples" >&2
        exit 2
    fi
done
KOLO=$(realpath "$KOLO")
EX=$(realpath "$EX")

# shellcheck source=scripts/e2e-lib.sh
source "$here/e2e-lib.sh"

TORCHRUN=${KOLO_TORCHRUN:-}
if [[ -z $TORCHRUN ]]; then
    venv=${KOLO_TORCH_VENV:-$HOME/.cache/kolo/torch-2.15.0}
    if [[ -x $venv/bin/torchrun ]]; then
        TORCHRUN=$venv/bin/torchrun
    else
        TORCHRUN=$(command -v torchrun || true)
    fi
elif [[ ! -x $TORCHRUN ]]; then
    echo "e2e-launchers: KOLO_TORCHRUN=$TORCHRUN is not an executable" >&2
    exit 2
fi
# torchrun's own chatter (its OMP_NUM_THREADS banner, numpy warnings) is left out of the logs.
export PYTHONWARNINGS=ignore

# trun SECONDS ARGS...: runs torchrun ARGS... in $TMP (its run directories land there); sets $out, $rc.
trun() {
    local secs=$1
    shift
    rc=0
    out=$(cd "$TMP" && timeout "$secs" "$TORCHRUN" "$@" 2>&1) || rc=$?
}

# pid_of_rank RANK COMM: the process named COMM whose environment has RANK=RANK.
pid_of_rank() {
    local f p
    for f in /proc/[0-9]*/environ; do
        p=${f#/proc/}
        p=${p%/environ}
        [[ $(cat "/proc/$p/comm" 2>/dev/null) == "$2" ]] || continue
        if tr '\0' '\n' <"$f" 2>/dev/null | grep -qx "RANK=$1"; then
            echo "$p"
            return
        fi
    done
}

matrix_ok() { has_line "sum: 28" && has_line "squares: 0 1 4 9 16 25 36 49"; }

check_torchrun_matrix() {
    local name="torchrun --nproc_per_node 2 --no-python matrix"
    trun 60 --nproc_per_node 2 --no-python "$EX/matrix"
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! matrix_ok; then fail "$name" "no 'sum: 28' and squares"; return; fi
    ok "$name"
}

check_torchrun_c10d() {
    local name="torchrun --rdzv-backend c10d --rdzv-endpoint (one node, 4 workers) runs matrix"
    local port=$((30000 + RANDOM % 2000))
    trun 60 --nnodes 1 --nproc_per_node 4 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
        --rdzv-id e2e --no-python "$EX/matrix"
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! matrix_ok; then fail "$name" "no 'sum: 28' and squares"; return; fi
    ok "$name"
}

check_torchrun_train() {
    local name="torchrun --standalone: kolo train --worker learns digits"
    trun 300 --standalone --nproc_per_node 2 --no-python "$KOLO" train --worker --model mlp \
        --dataset digits --epochs 4 --batch-size 32 --lr 0.05 --no-progress --out "$TMP/tr-train"
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    local acc
    acc=$(sed -n 's/.*final test accuracy \([0-9.]*\)%.*/\1/p' <<<"$out")
    if [[ -z $acc ]] || ! awk -v a="$acc" 'BEGIN { exit !(a >= 85) }'; then
        fail "$name" "final accuracy '${acc}' below 85%"
        return
    fi
    ok "$name (accuracy ${acc}%)"
}

# torchrun --max-restarts 1: rank 1 SIGKILLed after the first checkpoint; torchrun restarts the
# group (TORCHELASTIC_RESTART_COUNT=1), which resumes from the checkpoint and finishes.
check_torchrun_restart() {
    local name="torchrun --max-restarts 1: a killed worker, the group restarts and resumes"
    local dir=$TMP/tr-elastic log=$TMP/tr-elastic.log
    (cd "$TMP" && timeout 300 "$TORCHRUN" --standalone --nproc_per_node 2 --max-restarts 1 \
        --no-python "$KOLO" train --worker --model mlp --dataset mnist --train-limit 20000 \
        --test-limit 2000 --epochs 3 --batch-size 32 --lr 0.05 --no-progress --out "$dir") \
        >"$log" 2>&1 &
    local tpid=$! i victim=""
    for i in $(seq 600); do
        [[ -e $dir/checkpoints/latest ]] && break
        sleep 0.05
    done
    sleep 0.3 # into the second epoch
    victim=$(pid_of_rank 1 kolo)
    if [[ -z $victim ]]; then
        wait "$tpid" || true
        out=$(cat "$log")
        fail "$name" "no rank 1 to kill after the first checkpoint"
        return
    fi
    kill -9 "$victim"
    rc=0
    wait "$tpid" || rc=$?
    out=$(cat "$log")
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! grep -q "resumed from .*checkpoints (epoch [12] done" <<<"$out"; then
        fail "$name" "the restarted group did not resume from the checkpoint"
        return
    fi
    if ! grep -q "final test accuracy" <<<"$out"; then fail "$name" "no final accuracy"; return; fi
    ok "$name"
}

check_torchrun_mismatch() {
    local name="torchrun: a collective mismatch is kolo's error in torchrun's Root Cause"
    trun 60 --nproc_per_node 2 --no-python "$EX/ring_allreduce" --count 1000 --iters 2 --short-rank 1
    if ((rc == 0)); then fail "$name" "exit code 0"; return; fi
    if ((rc == 124)); then fail "$name" "timed out"; return; fi
    if ! grep -A8 "Root Cause" <<<"$out" | grep -q "KoloError: collective mismatch: rank . called all_reduce(f32 x 1000"; then
        fail "$name" "the Root Cause does not show kolo's mismatch message"
        return
    fi
    ok "$name"
}

# check_torchrun_killed [MONITOR_INTERVAL]: with a 0.001 s monitor interval torchrun SIGTERMs the
# survivor at once, before it can notice the loss by itself: kolo's SIGTERM report must name it.
check_torchrun_killed() {
    local monitor=${1:-0.1}
    local name="torchrun (monitor interval $monitor s): a worker SIGKILLed mid-collective ends the job within 10 s, kolo's message in the summary"
    local log=$TMP/tr-killed.log
    (cd "$TMP" && timeout 60 "$TORCHRUN" --monitor-interval "$monitor" --nproc_per_node 2 \
        --no-python "$EX/ring_allreduce" --count 4000000 --iters 1000) >"$log" 2>&1 &
    local tpid=$! i victim="" survivor=""
    for i in $(seq 100); do
        victim=$(pid_of_rank 1 ring_allreduce)
        [[ -n $victim ]] && break
        sleep 0.1
    done
    survivor=$(pid_of_rank 0 ring_allreduce)
    sleep 2
    if [[ -z $victim ]] || ! kill -0 "$tpid" 2>/dev/null; then
        wait "$tpid" || true
        out=$(cat "$log")
        fail "$name" "no running rank 1 to kill"
        return
    fi
    kill -9 "$victim"
    local waited=0
    while kill -0 "$tpid" 2>/dev/null && ((waited < 100)); do
        sleep 0.1
        waited=$((waited + 1))
    done
    if kill -0 "$tpid" 2>/dev/null; then
        wait "$tpid" || true
        out=$(cat "$log")
        fail "$name" "torchrun was still running 10 s after rank 1 was killed"
        return
    fi
    rc=0
    wait "$tpid" || rc=$?
    out=$(cat "$log")
    if ((rc == 0)); then fail "$name" "exit code 0"; return; fi
    if ! grep -q "Signal 9 (SIGKILL) received by PID $victim" <<<"$out"; then
        fail "$name" "the summary does not name the killed worker"
        return
    fi
    if ! grep -q "KoloError: .*rank 1" <<<"$out"; then
        fail "$name" "the summary does not show kolo's message naming rank 1"
        return
    fi
    if [[ -n $survivor ]] && kill -0 "$survivor" 2>/dev/null; then
        fail "$name" "rank 0 (pid $survivor) is still running"
        kill -9 "$survivor" 2>/dev/null || true
        return
    fi
    ok "$name (ended $((waited / 10)).$((waited % 10)) s after the kill)"
}

# Two hosts, each a network namespace with one end of a veth pair: torchrun --nnodes 2 on each,
# meeting through a c10d rendezvous on host 0.
check_torchrun_two_hosts() {
    local name="torchrun --nnodes 2 on two hosts (network namespaces) runs matrix"
    local tag="kolotr$$" port=$((29000 + RANDOM % 1000))
    local ns0="$tag-h0" ns1="$tag-h1"
    if ! ip netns add "$ns0" 2>/dev/null || ! ip netns add "$ns1" 2>/dev/null; then
        ip netns del "$ns0" 2>/dev/null || true
        skip "$name" "cannot create network namespaces here"
        return
    fi
    if ! { ip link add "$tag-a" type veth peer name "$tag-b" &&
        ip link set "$tag-a" netns "$ns0" && ip link set "$tag-b" netns "$ns1" &&
        ip -n "$ns0" addr add 10.78.0.1/24 dev "$tag-a" &&
        ip -n "$ns1" addr add 10.78.0.2/24 dev "$tag-b" &&
        ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
        ip -n "$ns0" link set "$tag-a" up && ip -n "$ns1" link set "$tag-b" up; } 2>/dev/null; then
        ip netns del "$ns0" 2>/dev/null || true
        ip netns del "$ns1" 2>/dev/null || true
        skip "$name" "cannot make a veth pair here"
        return
    fi
    local r pids=()
    for r in 0 1; do
        local ns=$ns0
        ((r == 1)) && ns=$ns1
        # Both namespaces share this machine's host name, so torchrun can neither tell which one
        # hosts the endpoint nor hand out its own name as MASTER_ADDR: say both (is_host,
        # --local-addr), as on hosts whose names do not resolve.
        (cd "$TMP" && ip netns exec "$ns" env KOLO_TIMEOUT=30 timeout 90 "$TORCHRUN" --nnodes 2 \
            --nproc_per_node 2 --rdzv-backend c10d --rdzv-endpoint "10.78.0.1:$port" \
            --rdzv-conf "is_host=$((r == 0))" --local-addr "10.78.0.$((r + 1))" \
            --rdzv-id two-hosts --no-python "$EX/matrix") >"$TMP/tr-node$r.log" 2>&1 &
        pids+=($!)
    done
    local rc0=0 rc1=0
    wait "${pids[0]}" || rc0=$?
    wait "${pids[1]}" || rc1=$?
    ip netns del "$ns0" 2>/dev/null || true
    ip netns del "$ns1" 2>/dev/null || true
    out=$(cat "$TMP/tr-node0.log" "$TMP/tr-node1.log")
    if ((rc0 != 0 || rc1 != 0)); then fail "$name" "exit codes $rc0 and $rc1"; return; fi
    if ! matrix_ok || (($(grep -c "^part: " <<<"$out") != 4)); then
        fail "$name" "matrix did not print sum 28, the squares and 4 parts"
        return
    fi
    ok "$name"
}

# kolo's c10d store server (the stand-in for torchrun's store in the test suite) against PyTorch's
# own TCPStore client.
check_c10d_server() {
    local name="kolo's c10d store server answers PyTorch's TCPStore client"
    local py server=$BIN/examples/c10d_server
    py=$(dirname "$TORCHRUN")/python
    if [[ ! -x $server || ! -x $py ]]; then
        skip "$name" "needs $server and torchrun's python"
        return
    fi
    rc=0
    out=$(timeout 60 "$py" "$here/check_c10d_server.py" "$server" 2>&1) || rc=$?
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    ok "$name ($(grep -o '[0-9]* passed' <<<"$out"))"
}

check_srun() {
    local name="srun (stand-in, SLURM variables only): matrix finds its rendezvous from the node list"
    rc=0
    out=$(timeout 60 "$here/fake-srun" -n 4 --nodelist '127.0.0.[1-4]' "$EX/matrix" 2>&1) || rc=$?
    if ((rc != 0)); then fail "$name" "exit code $rc"; return; fi
    if ! matrix_ok; then fail "$name" "no 'sum: 28' and squares"; return; fi
    ok "$name"
}

# bad_env NAME EXPECTED VAR=VALUE...: matrix under a bad launcher environment fails within 10 s
# with one error naming EXPECTED.
bad_env() {
    local name=$1 want=$2
    shift 2
    rc=0
    local t0=$SECONDS
    out=$(env -u MASTER_ADDR -u MASTER_PORT KOLO_TIMEOUT=2 timeout 30 env "$@" "$EX/matrix" 2>&1) || rc=$?
    if ((rc == 0 || rc == 124)); then fail "$name" "exit code $rc"; return; fi
    if ((SECONDS - t0 > 10)); then fail "$name" "took $((SECONDS - t0)) s"; return; fi
    if ! grep -qF -- "$want" <<<"$out"; then fail "$name" "no error naming '$want'"; return; fi
    ok "$name"
}

check_bad_environments() {
    local closed
    closed=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    bad_env "an unreachable torchrun store is named" "127.0.0.1:$closed" \
        RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$closed" TORCHELASTIC_USE_AGENT_STORE=True
    bad_env "a wrong TORCHELASTIC_USE_AGENT_STORE is named" "TORCHELASTIC_USE_AGENT_STORE" \
        RANK=0 WORLD_SIZE=2 MASTER_PORT=1 TORCHELASTIC_USE_AGENT_STORE=yes
    bad_env "a wrong TORCHELASTIC_RESTART_COUNT is named" "TORCHELASTIC_RESTART_COUNT" \
        RANK=0 WORLD_SIZE=2 MASTER_PORT=1 TORCHELASTIC_RESTART_COUNT=-1
    bad_env "a malformed SLURM node list is named" 'SLURM_STEP_NODELIST = "node[01-04,07"' \
        SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_JOB_ID=7 SLURM_STEP_NODELIST='node[01-04,07'
}

check_srun
check_bad_environments
if [[ -z $TORCHRUN ]]; then
    skip "torchrun checks" "no torchrun (set KOLO_TORCHRUN, or run scripts/install-torch.sh)"
else
    echo "# torchrun: $TORCHRUN ($("$TORCHRUN" --help >/dev/null 2>&1 && echo runs || echo broken))"
    check_torchrun_matrix
    check_torchrun_c10d
    check_torchrun_train
    check_torchrun_mismatch
    check_torchrun_killed
    check_torchrun_killed 0.001
    check_torchrun_restart
    check_torchrun_two_hosts
    check_c10d_server
fi

finish e2e-launchers
