#!/usr/bin/env python3
"""Runs kolo's all-reduce benchmark and the peers' (OpenMPI, Gloo) side by side and prints ratios.

    python3 scripts/compare_peers.py [--n 2] [--rounds 3] [--kolo target/release/kolo]
        [--python /path/to/python-with-torch] [--skip openmpi,kolo-shm] [--sizes 4,1024,...]
        [--baseline /path/to/an/older/kolo] [--op allreduce|p2p] [--csv busbw.csv]

Each round runs, in turn: OpenMPI (../shared/peers/run-openmpi.sh), kolo over shared memory, Gloo
(../shared/peers/gloo_allreduce.py, run with --python), the same Gloo harness with its backend
name changed to "kolo" (torch-kolo: kolo's Python package as PyTorch's backend; needs the kolo wheel
installed in --python's environment), kolo over TCP, and with --baseline the older
kolo binary over shared memory and TCP (kolo-shm-base, kolo-tcp-base: a before/after comparison
under the same load). Every
implementation prints one JSON line per size; the table shows the median over the rounds and the
ratios the targets are stated in:

- kolo-shm busbw >= OpenMPI's from 1 KiB to 64 MiB, >= 1.5x at 16 and 64 MiB;
- kolo-shm 4-byte latency <= 2x OpenMPI's;
- kolo-shm busbw >= 3x Gloo's; kolo-tcp busbw >= 1.5x Gloo's;
- torch-kolo (torch.distributed.all_reduce on the kolo backend) >= 3x Gloo's speed at every size.

With `--op p2p`: ping-pong between two ranks instead (time is half a round trip), OpenMPI's MPI_Send/
MPI_Recv (scripts/mpi_pingpong.c, compiled with mpicc) against `kolo bench p2p` over shared memory
and TCP (and --baseline); the target: kolo-shm's bandwidth >= OpenMPI's at every size. Its ratio
column is the median of the rounds' own ratios (each round runs both within a second or two): a
shared machine that moves between a fast and a slow state makes the medians of the times compare
rounds of different states, the rounds' ratios do not.

With `--csv FILE` (all-reduce): the median bus bandwidth of each implementation at each size is also
written to FILE and drawn (log-log, titled with the CPU) into FILE's .png by `kolo plot`.

A peer that cannot run (OpenMPI or torch not installed) is reported and left out. The spread of each
median (min..max over the rounds, as ratios) is printed for kolo-tcp / Gloo, since the machine the
numbers come from may be shared.
"""
import argparse
import atexit
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

import benchhost

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEERS = os.environ.get("KOLO_PEERS_DIR", os.path.join(ROOT, "..", "shared", "peers"))
SIZES = [4, 1024, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip()[-400:]
    rows = {}
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[int(r["bytes"])] = r
    return rows, None


def with_backend(harness, backend):
    """A copy of the Gloo harness with `backend` in place of "gloo" (process group and the impl
    name it prints): the same program, another torch.distributed backend."""
    with open(harness) as f:
        text = f.read()
    patched = text.replace('dist.init_process_group("gloo"', f'dist.init_process_group("{backend}"')
    patched = patched.replace('"impl": "gloo"', f'"impl": "torch-{backend}"')
    if patched.count(f'"{backend}"') < 1 or patched == text:
        sys.exit(f"compare_peers: {harness} no longer calls init_process_group(\"gloo\", ...)")
    f = tempfile.NamedTemporaryFile("w", prefix=f"{backend}_allreduce_", suffix=".py", delete=False)
    with f:
        f.write(patched)
    atexit.register(os.unlink, f.name)
    return f.name


def write_plot(args, results, sizes):
    """The busbw of every implementation that ran at its median time (nccl-tests' formula: bytes /
    time x 2(n-1)/n), one column each, to args.csv; then
    `kolo plot` draws it (log-log) into the PNG beside it."""
    names = [k for k in results if results[k]]
    with open(args.csv, "w") as f:
        f.write(",".join(["bytes"] + names) + "\n")
        for b in sizes:
            cells = []
            for k in names:
                rs = results[k].get(b)
                # From the time (the harnesses round busbw to a few decimals: Gloo's 4 B is 0.0).
                t = statistics.median(r["time_us"] for r in rs) if rs else 0
                bus = b / (t * 1e-6) / 1e9 * 2 * (args.n - 1) / args.n if t else None
                cells.append(f"{bus:.6g}" if bus else "")
            f.write(",".join([str(b)] + cells) + "\n")
    png = os.path.splitext(args.csv)[0] + ".png"
    title = (f"all-reduce f32, {args.n} ranks, medians of {args.rounds} rounds — {benchhost.cpu_model()}, "
             f"{os.cpu_count()} cores")
    subprocess.run([args.kolo, "plot", args.csv, "--out", png, "--title", title,
                    "--x-desc", "message size", "--y-desc", "bus bandwidth (GB/s)", "--bytes-x",
                    "--log-y"], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kolo", default=os.path.join(ROOT, "target", "release", "kolo"))
    ap.add_argument("--skip", default="", help="comma-separated implementations to leave out")
    ap.add_argument("--python", default=sys.executable, help="the Python (with torch) that runs Gloo")
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="bytes, comma-separated")
    ap.add_argument("--baseline", help="an older kolo binary, measured over shared memory and TCP "
                                       "as kolo-shm-base and kolo-tcp-base")
    ap.add_argument("--op", default="allreduce", choices=["allreduce", "p2p"])
    ap.add_argument("--csv", help="also write the median busbw (GB/s) of each implementation at each "
                                  "size here (all-reduce), and draw it beside as a PNG with `kolo plot`")
    args = ap.parse_args()
    print(benchhost.describe()[0])
    n = str(args.n)
    sizes = [str(int(s)) for s in args.sizes.split(",")]
    kolo = lambda t, exe=args.kolo: ([exe, "bench", args.op, "-n", n, "--json", "--sizes", ",".join(sizes)],
                                     {"KOLO_TRANSPORT": t})
    if args.op == "p2p":
        return p2p(args, sizes, kolo)
    impls = {
        "openmpi": (["bash", os.path.join(PEERS, "run-openmpi.sh"), n] + sizes, None),
        "kolo-shm": kolo("shm"),
        "gloo": ([args.python, os.path.join(PEERS, "gloo_allreduce.py"), n] + sizes, None),
        "torch-kolo": ([args.python, with_backend(os.path.join(PEERS, "gloo_allreduce.py"), "kolo"), n]
                       + sizes, None),
        "kolo-tcp": kolo("tcp"),
    }
    if args.baseline:
        impls["kolo-shm-base"] = kolo("shm", args.baseline)
        impls["kolo-tcp-base"] = kolo("tcp", args.baseline)
    results, broken = rounds(args, impls)

    def med(name, b, field):
        rs = results[name].get(b)
        return statistics.median(r[field] for r in rs) if rs else None

    def ratio(a, b):
        return f"{a / b:6.2f}x" if a and b else "     -"

    def spread(name, b):
        """min..max over the rounds of Gloo's time / name's time in the same round."""
        rs = per_round(results, "gloo", name, b)
        return f"{min(rs):.2f}..{max(rs):.2f}" if rs else "-"

    if args.csv:
        write_plot(args, results, [int(x) for x in sizes])
    print(f"all-reduce f32 sum, n = {args.n}, medians of {args.rounds} rounds (busbw in GB/s, time in us)")
    hdr = f"{'bytes':>10} {'openmpi':>9} {'gloo':>9} {'kolo-shm':>9} {'kolo-tcp':>9}   {'shm/ompi':>8} {'shm/gloo':>8} {'tcp/gloo':>8}"
    print(hdr)
    misses = []
    sizes = [int(s) for s in sizes]
    for b in sizes:
        o, g, s, t = (med(k, b, "busbw_gbps") for k in ("openmpi", "gloo", "kolo-shm", "kolo-tcp"))
        f = lambda v: f"{v:9.3f}" if v is not None else f"{'-':>9}"
        print(f"{b:>10} {f(o)} {f(g)} {f(s)} {f(t)}   {ratio(s, o):>8} {ratio(s, g):>8} {ratio(t, g):>8}")
        if b >= 1024 and s and o and s < o:
            misses.append(f"{b} B: kolo-shm busbw {s:.3f} < OpenMPI {o:.3f}")
        if b >= 16 << 20 and s and o and s < 1.5 * o:
            misses.append(f"{b} B: kolo-shm busbw {s:.3f} < 1.5 x OpenMPI {o:.3f}")
        if s and g and s < 3 * g:
            misses.append(f"{b} B: kolo-shm busbw {s:.3f} < 3 x Gloo {g:.3f}")
        if t and g and t < 1.5 * g:
            misses.append(f"{b} B: kolo-tcp busbw {t:.3f} < 1.5 x Gloo {g:.3f}")
    tcp_impls = [k for k in ("kolo-tcp", "kolo-tcp-base", "torch-kolo") if results.get(k)]
    if results["gloo"] and tcp_impls:
        # Speed-ups from the times, which keep their precision at every size (busbw rounds to 0 at 4 B).
        print("\nkolo over TCP, and PyTorch on the kolo backend (torch-kolo), vs Gloo: time per all-reduce "
              "(us, median of the rounds) and speed-up (Gloo's time / kolo's; min..max of the rounds' ratios)")
        print(f"{'bytes':>10} {'gloo':>10} " + " ".join(f"{k:>14} {'speedup':>8} {'spread':>11}" for k in tcp_impls))
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"
        for b in sizes:
            g = med("gloo", b, "time_us")
            cells = []
            for k in tcp_impls:
                t = med(k, b, "time_us")
                cells.append(f"{fmt(t):>14} {ratio(g, t):>8} {spread(k, b):>11}")
                if k == "torch-kolo" and t and g and g < 3 * t:
                    misses.append(f"{b} B: torch-kolo {t:.1f} us, not 3x faster than Gloo's {g:.1f} us")
            print(f"{b:>10} {fmt(g):>10} " + " ".join(cells))
        print()
    for t in ("shm", "tcp"):
        new, base = f"kolo-{t}", f"kolo-{t}-base"
        if results.get(new) and results.get(base):
            print(f"\nkolo-{t} against the --baseline build, same rounds: time per all-reduce (us, medians) "
                  "and the baseline's time / this build's")
            for b in sizes:
                n, o = med(new, b, "time_us"), med(base, b, "time_us")
                if n and o:
                    print(f"{b:>10} {o:>12.1f} {n:>12.1f} {o / n:8.2f}x")
    lo, ls = med("openmpi", 4, "time_us"), med("kolo-shm", 4, "time_us")
    lg, lt = med("gloo", 4, "time_us"), med("kolo-tcp", 4, "time_us")
    print(f"4-byte latency (us): openmpi {lo}, kolo-shm {ls} ({ratio(ls, lo).strip()} of OpenMPI), "
          f"gloo {lg}, kolo-tcp {lt}")
    if lo and ls and ls > 2 * lo:
        misses.append(f"4 B: kolo-shm {ls:.3f} us > 2 x OpenMPI {lo:.3f} us")
    for name, err in broken.items():
        print(f"not measured: {name}: {err}")
    print("targets: all met" if not misses else "targets missed:\n  " + "\n  ".join(misses))


def per_round(results, peer, name, b):
    """`peer`'s time / `name`'s in each round at `b` bytes (the rounds both ran)."""
    xs, ps = results[name].get(b, []), results[peer].get(b, [])
    return [p["time_us"] / x["time_us"] for x, p in zip(xs, ps) if x["time_us"]]


def rounds(args, impls):
    """Runs every implementation once a round, each round starting with a different one (so that a
    slow patch of a shared machine does not always fall on the same one); returns the rows of each
    by size, and the reasons of those that could not run."""
    skip = set(filter(None, args.skip.split(",")))
    results = {k: {} for k in impls}
    broken = {}
    order = list(impls)
    for rnd in range(args.rounds):
        for name in order[rnd % len(order):] + order[:rnd % len(order)]:
            cmd, env = impls[name]
            if name in skip or name in broken:
                continue
            rows, err = run(cmd, env)
            if rows is None:
                broken[name] = err
                print(f"# {name} did not run: {err}", file=sys.stderr)
                continue
            for b, r in rows.items():
                results[name].setdefault(b, []).append(r)
            print(f"# round {rnd + 1}: {name} done", file=sys.stderr)
    return results, broken


def split_iters(impl, sizes):
    """`kolo bench p2p` as one shell command: sizes below 64 KiB with 100,000 round trips (a few
    milliseconds of sub-microsecond messages are too short to time well), the others with its
    default counts — what scripts/mpi_pingpong.c does for OpenMPI."""
    cmd, env = impl
    at = cmd.index("--sizes")
    small = [s for s in sizes if int(s) < 64 << 10]
    large = [s for s in sizes if int(s) >= 64 << 10]
    parts = []
    if small:
        parts.append(cmd[:at] + ["--sizes", ",".join(small), "--iters", "100000"])
    if large:
        parts.append(cmd[:at] + ["--sizes", ",".join(large)])
    return (["sh", "-c", " && ".join(shlex.join(p) for p in parts)], env)


def p2p(args, sizes, kolo):
    """Ping-pong: OpenMPI against kolo over shared memory and TCP (and the baseline)."""
    exe = os.path.join(tempfile.mkdtemp(), "mpi_pingpong")
    built = subprocess.run(["mpicc", "-O2", os.path.join(HERE, "mpi_pingpong.c"), "-o", exe],
                           capture_output=True, text=True)
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else ["mpirun"]
    impls = {"openmpi": (mpirun + ["-n", "2", exe] + sizes, None) if built.returncode == 0
             else (["false"], None),
             "kolo-shm": split_iters(kolo("shm"), sizes), "kolo-tcp": split_iters(kolo("tcp"), sizes)}
    if args.baseline:
        impls["kolo-shm-base"] = split_iters(kolo("shm", args.baseline), sizes)
    results, broken = rounds(args, impls)
    if built.returncode != 0:
        broken["openmpi"] = built.stderr.strip()[-300:] or "mpicc failed"
    names = [k for k in impls if results[k]]

    def med(name, b, field):
        rs = results[name].get(b)
        return statistics.median(r[field] for r in rs) if rs else None

    def round_ratios(b, other="openmpi"):
        """`other`'s time / kolo-shm's in each round, sorted."""
        if len(results[other].get(b, [])) != len(results["kolo-shm"].get(b, [])):
            return []
        return sorted(per_round(results, other, "kolo-shm", b))

    def spread(rs):
        """The median of the rounds' ratios `rs` and their middle half."""
        q = len(rs) // 4
        return f"{statistics.median(rs):8.2f}x ({rs[q]:.2f}..{rs[-1 - q]:.2f})" if rs else f"{'-':>9}"

    base = "kolo-shm-base" in names
    print(f"ping-pong between 2 ranks, medians of {args.rounds} rounds: time one way (us) and bandwidth (GB/s);"
          " shm/ompi: the median of the rounds' ratios (and their middle half)"
          + ("; shm/base: the same against the baseline build" if base else ""))
    print(f"{'bytes':>10} " + " ".join(f"{k + ' us':>14} {'GB/s':>7}" for k in names) + f" {'shm/ompi':>9}"
          + (f" {'shm/base':>22}" if base else ""))
    misses = []
    for b in (int(s) for s in sizes):
        cells = []
        for k in names:
            t, bw = med(k, b, "time_us"), med(k, b, "algbw_gbps")
            cells.append(f"{t:14.3f} {bw:7.3f}" if t is not None else f"{'-':>14} {'-':>7}")
        o, s = med("openmpi", b, "time_us") if "openmpi" in names else None, med("kolo-shm", b, "time_us")
        rs = round_ratios(b) if "openmpi" in names else []
        ratio = statistics.median(rs) if rs else None
        against_base = f" {spread(round_ratios(b, 'kolo-shm-base')):>22}" if base else ""
        print(f"{b:>10} " + " ".join(cells) + f" {spread(rs)}" + against_base)
        if ratio and ratio < 1:
            misses.append(f"{b} B: kolo-shm at {ratio:.2f}x OpenMPI's bandwidth ({s:.3f} against {o:.3f} us"
                          " one way, medians)")
    for name, err in broken.items():
        print(f"not measured: {name}: {err}")
    print("targets: all met" if not misses else "targets missed:\n  " + "\n  ".join(misses))


if __name__ == "__main__":
    main()
