#!/usr/bin/env bash
# Coverage-guided fuzzing of kolo's decoders with AFL++ (crates/kolo-fuzz).
#
#   scripts/fuzz.sh [TARGET[,TARGET...]|all] [SECONDS]
#
# Builds the targets instrumented (target/afl, Debian's afl++ runtime; installs afl++ with apt if
# afl-fuzz is missing), runs each for SECONDS (default 60; 0 only builds) from its committed corpus
# (crates/kolo-fuzz/corpus/TARGET), KOLO_FUZZ_JOBS at a time (default 1), and prints each target's
# executions, executions per second, paths found, crashes and hangs from AFL++'s fuzzer_stats.
# Findings are under target/afl/out/TARGET/default/{crashes,hangs}. Exits non-zero if any target
# crashed or hung. KOLO_FUZZ_NO_TRAIN=1 leaves out the checkpoint target (which builds candle).
set -euo pipefail
cd "$(dirname "$0")/.."

which="${1:-all}"
seconds="${2:-60}"
jobs="${KOLO_FUZZ_JOBS:-1}"
out_root=target/afl/out

all=(store transport data checkpoint)
features=afl
if [[ "${KOLO_FUZZ_NO_TRAIN:-0}" == 1 ]]; then
  all=(store transport data)
  features="afl --no-default-features"
fi
if [[ "$which" == all ]]; then
  targets=("${all[@]}")
else
  IFS=, read -r -a targets <<<"$which"
  [[ ",$which," == *,checkpoint,* ]] || features="afl --no-default-features"
fi

if ! command -v afl-fuzz >/dev/null 2>&1; then
  SUDO=""
  if ((EUID != 0)) && command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi
  echo "installing afl++"
  $SUDO apt-get update -q >/dev/null
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q afl++ >/dev/null
fi
runtime=""
for dir in /usr/lib/afl /usr/local/lib/afl; do
  [[ -f "$dir/afl-compiler-rt.o" ]] && runtime="$dir/afl-compiler-rt.o" && break
done
[[ -n "$runtime" ]] || { echo "afl-compiler-rt.o not found (is afl++ installed?)" >&2; exit 1; }

# The instrumentation cargo-afl uses on stable Rust, with AFL++'s runtime linked in.
export RUSTFLAGS="-C debug-assertions -C overflow-checks -C opt-level=3 \
  -C passes=sancov-module -C llvm-args=-sanitizer-coverage-level=3 \
  -C llvm-args=-sanitizer-coverage-trace-pc-guard -C llvm-args=-sanitizer-coverage-prune-blocks=0 \
  -C llvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -C link-arg=$runtime"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "fuzz-$t"); done
echo "building ${targets[*]} (instrumented, target/afl)"
# shellcheck disable=SC2086
CARGO_TARGET_DIR=target/afl cargo build --locked -p kolo-fuzz --features $features "${bins[@]}"
unset RUSTFLAGS
((seconds > 0)) || exit 0

export AFL_SKIP_CPUFREQ=1 AFL_NO_UI=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1
export AFL_QUIET=1
run_one() {
  local t=$1 out="$out_root/$1"
  rm -rf "$out"
  mkdir -p "$out"
  # -V stops after SECONDS; -t 1000: an input that takes over a second is a hang.
  afl-fuzz -i "crates/kolo-fuzz/corpus/$t" -o "$out" -V "$seconds" -t 1000 -m none \
    -- "target/afl/debug/fuzz-$t" >"$out/afl.log" 2>&1 || {
    echo "afl-fuzz failed for $t:" >&2
    tail -20 "$out/afl.log" >&2
    return 1
  }
}

status=0
running=0
for t in "${targets[@]}"; do
  echo "fuzzing $t for ${seconds}s"
  run_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || status=1
    running=$((running - 1))
  fi
done
while ((running > 0)); do
  wait -n || status=1
  running=$((running - 1))
done

stat() { sed -n "s/^$1 *: *//p" "$2" | head -1; }
printf '\n%-11s %10s %10s %8s %8s %8s %9s %7s\n' target seconds execs 'exec/s' paths crashes hangs coverage
for t in "${targets[@]}"; do
  f="$out_root/$t/default/fuzzer_stats"
  if [[ ! -f "$f" ]]; then
    echo "$t: no fuzzer_stats"
    status=1
    continue
  fi
  execs=$(stat execs_done "$f")
  secs=$(( $(stat last_update "$f") - $(stat start_time "$f") ))
  crashes=$(stat saved_crashes "$f")
  hangs=$(stat saved_hangs "$f")
  rate=$(( secs > 0 ? execs / secs : execs ))
  printf '%-11s %10s %10s %8s %8s %8s %9s %7s\n' "$t" "$secs" "$execs" "$rate" \
    "$(stat corpus_count "$f")" "$crashes" "$hangs" "$(stat bitmap_cvg "$f")"
  if [[ "${crashes:-0}" != 0 || "${hangs:-0}" != 0 ]]; then
    echo "  findings: $out_root/$t/default/crashes and hangs" >&2
    status=1
  fi
done
exit "$status"
