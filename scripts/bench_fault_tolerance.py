#!/usr/bin/env python3
"""Goodput of `kolo train` when workers are killed: fault-tolerant vs restart-from-checkpoint.

Trains LeNet on Fashion-MNIST for --epochs epochs with -n workers, three ways, on each transport:

  undisturbed      no kills (the reference)
  fault-tolerant   kolo train --fault-tolerant --max-restarts K: survivors go on from their last
                   step, the launcher restarts the killed worker, which rejoins at a step boundary
  restart          kolo train --max-restarts K: the launcher restarts every worker, which resume
                   from the newest epoch checkpoint (today's elastic mode)

and, in the last two, SIGKILLs one worker every --every seconds (ranks in turn, rank 0 included),
the same schedule for both. Transports: shm and tcp (one host, -n workers), and netns: two hosts
(network namespaces joined by a veth pair, -n workers on each, TCP between them); run the script
under scripts/netns-with.sh for it (root). Goodput = useful samples (epochs x training samples) / wall seconds.
Prints a Markdown table; exits non-zero if a disturbed run fails or its test accuracy (the mean of
the last three epochs) is more than --max-drop points below the undisturbed one's.

    scripts/bench_fault_tolerance.py --kolo target/release/kolo -n 3 --epochs 15 --every 20
    scripts/netns-with.sh scripts/bench_fault_tolerance.py --transports netns -n 2 --epochs 15
"""

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def worker_pids(launcher_pids):
    """{rank: pid} of the launchers' worker processes."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid not in launcher_pids:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(
                    kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv
                )
            out[int(env.get(b"RANK", b"-1"))] = int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return out


def launch(args, transport, mode, out):
    """Starts the job's launchers (one, or one per network-namespace host); returns them."""
    cmd = [args.kolo, "train", "-n", str(args.n), "--epochs", str(args.epochs),
           "--no-progress", "--seed", "1"]
    if mode == "fault-tolerant":
        cmd += ["--fault-tolerant", "--max-restarts", "1000"]
    elif mode == "restart":
        cmd += ["--max-restarts", "1000"]
    if transport != "netns":
        log = open(os.path.join(out, "launcher.log"), "w")
        env = dict(os.environ, KOLO_TRANSPORT=transport)
        return [subprocess.Popen(cmd + ["--out", out], env=env, stdout=log,
                                 stderr=subprocess.STDOUT)]
    hosts = os.environ.get("KOLO_NETNS", "").split()
    if len(hosts) != 4:
        sys.exit("--transports netns: run under scripts/netns-with.sh (KOLO_NETNS is not set)")
    port = str(29000 + os.getpid() % 900)
    procs = []
    for node in (0, 1):
        ns, iface = hosts[2 * node], hosts[2 * node + 1]
        node_out = out if node == 0 else os.path.join(out, "node1")
        os.makedirs(node_out, exist_ok=True)
        log = open(os.path.join(node_out, "launcher.log"), "w")
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns] + cmd + [
                "--out", node_out, "--nnodes", "2", "--node-rank", str(node),
                "--master-addr", "10.77.0.1", "--master-port", port, "--iface", iface],
            stdout=log, stderr=subprocess.STDOUT))
    return procs


def last3(out, summary):
    """Mean test accuracy of the last three epochs: from metrics.csv where there is one (after a
    resume summary.json holds only the epochs since; a restarted epoch's later row wins), else
    from summary.json."""
    acc = {}
    try:
        with open(os.path.join(out, "metrics.csv")) as f:
            for row in csv.DictReader(f):
                acc[int(row["epoch"])] = float(row["test_accuracy"])
    except (OSError, KeyError, ValueError):
        acc = {e["epoch"]: e["test_accuracy"] for e in summary.get("epochs", [])}
    last = [acc[e] for e in sorted(acc)[-3:]]
    return sum(last) / 3 if len(last) == 3 else None


def run(args, transport, mode, log_dir):
    out = tempfile.mkdtemp(prefix=f"kolo-ft-{transport}-{mode}-", dir=log_dir)
    workers = args.n * (2 if transport == "netns" else 1)
    t0 = time.monotonic()
    procs = launch(args, transport, mode, out)
    # `ip netns exec` runs the launcher in its own process (it execs): the same pid.
    launchers = {p.pid for p in procs}
    kills, victim = [], 1 % workers
    next_kill = t0 + args.every
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if mode != "undisturbed" and now >= next_kill:
            pids = worker_pids(launchers)
            if victim in pids:
                try:
                    os.kill(pids[victim], signal.SIGKILL)
                    kills.append((round(now - t0, 1), victim))
                except ProcessLookupError:
                    pass
            victim = (victim + 1) % workers
            next_kill += args.every
        time.sleep(0.1)
    wall = time.monotonic() - t0
    code = next((p.returncode for p in procs if p.returncode != 0), 0)
    summary = {}
    try:
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    except OSError:
        pass
    return {
        "transport": transport, "mode": mode, "code": code, "wall": wall,
        "kills": kills, "accuracy": summary.get("final_accuracy"),
        # Test accuracy moves by up to a point from one epoch to the next (SGD at a fixed rate):
        # the mean of the last three epochs is the steadier figure to compare.
        "last3": last3(out, summary),
        "reconfigurations": len(summary.get("reconfigurations", [])), "dir": out,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kolo", default="target/release/kolo")
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--every", type=float, default=20.0, help="seconds between kills")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--modes", default="undisturbed,fault-tolerant,restart")
    ap.add_argument("--train-samples", type=int, default=60000)
    ap.add_argument("--max-drop", type=float, default=0.5, help="accuracy points")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    log_dir = tempfile.mkdtemp(prefix="kolo-ft-bench-")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} cores; {args.n} workers (per host on netns), LeNet / Fashion-MNIST, "
          f"{args.epochs} epochs, a worker SIGKILLed every {args.every:g} s; logs in {log_dir}")
    rows, bad = [], False
    for transport in args.transports.split(","):
        base = None
        for mode in args.modes.split(","):
            r = run(args, transport, mode, log_dir)
            r["goodput"] = args.epochs * args.train_samples / r["wall"]
            if mode == "undisturbed":
                base = r
            r["vs"] = r["goodput"] / base["goodput"] if base else None
            r["drop"] = (100 * (base["last3"] - r["last3"])
                         if base and base["last3"] is not None and r["last3"] is not None
                         else None)
            if r["code"] != 0 or r["accuracy"] is None or (r["drop"] or 0) > args.max_drop:
                bad = True
            rows.append(r)
            print(f"  {transport} {mode}: exit {r['code']}, {r['wall']:.1f} s, "
                  f"{len(r['kills'])} kills, accuracy {r['accuracy']}", flush=True)
    print()
    print("| transport | mode | kills | wall s | goodput samples/s | vs undisturbed | final accuracy % "
          "| last 3 epochs % | Δ points (last 3) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = f"{100 * r['accuracy']:.2f}" if r["accuracy"] is not None else "failed"
        last3 = f"{100 * r['last3']:.2f}" if r["last3"] is not None else "-"
        vs = f"{r['vs']:.2f}" if r["vs"] else "-"
        drop = f"{0.0 - r['drop']:+.2f}" if r["drop"] is not None else "-"
        print(f"| {r['transport']} | {r['mode']} | {len(r['kills'])} | {r['wall']:.1f} | "
              f"{r['goodput']:.0f} | {vs} | {acc} | {last3} | {drop} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
