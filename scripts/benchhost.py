"""The machine a benchmark runs on, as every figure must name it: the CPU's model and the flags that
pick kolo's kernels, and how busy the machine already was when the benchmark started.

Figures taken while something else keeps a core busy are not comparable with any other run: on a
2-core machine one stray process halves a worker's speed. ``busy_cores`` samples ``/proc/stat``
before the first round and ``describe`` says so — with a warning on stderr above ``BUSY_LIMIT``
— so a polluted table shows it on its first line instead of passing for a slow build.

``python3 scripts/benchhost.py`` prints the line; ``--self-test`` checks that one busy child
process shows as (about) one busy core.
"""

import os
import subprocess
import sys
import time

#: Cores kept busy by others above which a benchmark's figures are flagged.
BUSY_LIMIT = 0.25

#: The CPU flags that decide which of kolo's kernels run (and which peaks peak_flops reports).
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def cpuinfo_field(name):
    """The first value of ``name`` in /proc/cpuinfo, or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model():
    """The CPU's model name ("unknown" where /proc/cpuinfo does not say)."""
    return cpuinfo_field("model name") or "unknown"


def kernel_flags():
    """Which of ``KERNEL_FLAGS`` this CPU has, in that order; None where /proc/cpuinfo lists no
    flags (not x86, or unreadable)."""
    flags = cpuinfo_field("flags")
    if flags is None:
        return None
    have = set(flags.split())
    return [f for f in KERNEL_FLAGS if f in have]


def _cpu_times():
    """(busy, total) jiffies of all CPUs together, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is counted in user already).
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


def busy_cores(interval=1.0):
    """How many cores' worth of CPU time the machine spent busy over the next ``interval``
    seconds (the caller sleeping meanwhile: all of it is someone else's); None without
    /proc/stat."""
    try:
        b0, t0 = _cpu_times()
        time.sleep(interval)
        b1, t1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    if t1 <= t0:
        return 0.0
    return (b1 - b0) / (t1 - t0) * (os.cpu_count() or 1)


def describe(interval=1.0):
    """The line naming the machine and its load before a benchmark, and the load measured (None
    where unknown); warns on stderr where others kept more than ``BUSY_LIMIT`` cores busy."""
    busy = busy_cores(interval)
    have = kernel_flags()
    if have is None:
        flags = "flags unknown"
    else:
        flags = " ".join(have) or "none of " + " ".join(KERNEL_FLAGS)
    load = "unknown" if busy is None else f"{busy:.2f}"
    line = (f"CPU: {cpu_model()} ({os.cpu_count()} CPUs; {flags}); "
            f"cores busy before the run: {load}")
    if busy is not None and busy > BUSY_LIMIT:
        print(f"warning: {busy:.2f} cores were busy before this benchmark started (other "
              f"processes); its figures compare with no other run's — run it on an idle machine",
              file=sys.stderr)
    return line, busy


def _self_test():
    idle = busy_cores(0.5)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        loaded = busy_cores(1.0)
    finally:
        hog.kill()
        hog.wait()
    print(f"idle {idle:.2f} cores busy, with one busy child {loaded:.2f}")
    cores = os.cpu_count() or 1
    if idle is not None and idle > cores - 1:
        # Others keep every core busy: one more busy process cannot add a core. Say so, loudly.
        print(f"benchhost self-test: SKIPPED the busy-core check ({idle:.2f} of {cores} cores "
              f"were busy before it; it needs one idle core)", file=sys.stderr)
    elif loaded is None or not (loaded - (idle or 0) > 0.7):
        sys.exit("benchhost self-test: a busy child process did not show as a busy core")
    # Without /proc/cpuinfo's answers the line says it does not know, not that no flag is there.
    real = globals()["cpuinfo_field"]
    globals()["cpuinfo_field"] = lambda name: None
    try:
        line = describe(0.1)[0]
    finally:
        globals()["cpuinfo_field"] = real
    print(line)
    if "flags unknown" not in line or "CPU: unknown" not in line:
        sys.exit("benchhost self-test: an unreadable /proc/cpuinfo was not reported as unknown")
    print("benchhost self-test: ok")


if __name__ == "__main__":
    if "--self-test" in sys.argv[1:]:
        _self_test()
    else:
        print(describe()[0])
