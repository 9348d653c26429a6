#!/usr/bin/env python3
"""Measures what kolo's always-on collective fingerprint check costs, with `kolo bench`.

    python3 scripts/fingerprint_cost.py [--rounds 7] [--n 2] [--kolo target/release/kolo]

Every collective carries a fingerprint (sequence number, op, dtype, count, root, group) in its
messages' headers, checked by every receiver; on shared memory, collectives other than all-reduce also
start with a fingerprint step (KOLO_CONFIRM_CALLS, on by default), so that a mismatch is caught even
where no message would flow. This script runs each operation with that step on and off
(KOLO_CONFIRM_CALLS=1/0, alternating, over several rounds) on the default transport (shared memory)
and over TCP, and prints the median times and the difference. The header check itself cannot be
turned off: it is part of the wire format (33 bytes per message).
"""
import argparse
import json
import os
import statistics
import subprocess

OPS = ["broadcast", "allgather", "reduce_scatter", "alltoall", "allreduce"]
SIZES = "4,1K,64K"


def bench(kolo, op, n, confirm, transport):
    env = dict(os.environ, KOLO_CONFIRM_CALLS=confirm, KOLO_TRANSPORT=transport)
    p = subprocess.run([kolo, "bench", op, "-n", str(n), "--sizes", SIZES, "--json"],
                       capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"kolo bench {op} failed: {p.stderr[-300:]}")
    return {d["bytes"]: d["time_us"] for d in map(json.loads, p.stdout.splitlines())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--kolo", default="target/release/kolo")
    a = ap.parse_args()
    print(f"fingerprint step cost, n = {a.n}, medians of {a.rounds} rounds (time per call, us)")
    print(f"{'transport':>9} {'op':>15} {'bytes':>7} {'checked':>9} {'unchecked':>9} {'cost':>8}")
    for transport in ["shm", "tcp"]:
        for op in OPS:
            on, off = {}, {}
            for _ in range(a.rounds):
                for confirm, acc in (("1", on), ("0", off)):
                    for b, t in bench(a.kolo, op, a.n, confirm, transport).items():
                        acc.setdefault(b, []).append(t)
            for b in sorted(on):
                m_on, m_off = statistics.median(on[b]), statistics.median(off[b])
                print(f"{transport:>9} {op:>15} {b:>7} {m_on:>9.2f} {m_off:>9.2f} {m_on - m_off:>+8.2f}")


if __name__ == "__main__":
    main()
