#!/usr/bin/env python3
"""Training throughput benchmark: kolo against a plain candle loop and PyTorch DDP (Gloo), side by side.

Runs, alternating, ROUNDS times each (default 3) and reports medians:
  plain    the plain candle loop (crates/kolo-train/examples/plain_loop.rs), one process, no kolo
  kolo-1   `kolo train -n 1`   (Ddp, loss check, sampler: the cost of kolo's layer with one worker)
  kolo-2   `kolo train -n 2`
  torch-1  PyTorch DDP (Gloo, one thread per worker), 1 worker: --model lenet runs
           ../shared/peers/torch_ddp_lenet.py (needs numpy too), resnet18 and mlp scripts/torch_ddp_resnet18.py
  torch-2  the same with 2 workers
All use --model (lenet, the default, resnet18 or mlp) on Fashion-MNIST, SGD with the same --lr and --momentum
(default 0.05 and 0.9; the plain loop always uses these), one compute thread per worker, the same per-worker
batch (--batch, default 64 for lenet, 32 for resnet18), one epoch of the first --train-limit samples (default:
all 60,000 for lenet, 2048 for resnet18; the LeNet peer always trains on all of them), evaluation on the first
--test-limit test samples (default: all for lenet, 256 for resnet18); samples/s counts training only (no
evaluation), all workers together.

Besides the medians it reports kolo / PyTorch (samples/s of kolo-N over torch-N, N = 1, 2) and, for every
row, the achieved GFLOP/s per core: samples/s x training FLOPs per sample / busy cores (workers x 1 thread),
also as a share of the CPU's per-core f32 FMA peak. The FLOPs per sample (forward and backward, convolutions
and matrix products) are counted by torch's FlopCounterMode on the peer's model (the same layers as kolo's,
so the count applies to every row; `scripts/torch_ddp_resnet18.py --flops MODEL`); without PyTorch the
GFLOP/s are left out. They are nominal (direct-convolution) FLOPs: where kolo runs a 3x3 convolution as
Winograd F(4x4, 3x3), which multiplies up to 4x less, its GFLOP/s are effective ones and may exceed
what the GEMM executes. The peak is --peak-flops GFLOPS (per core) or, when that is not given, the
`peak_gflops_per_core` of the probe BIN/examples/peak_flops (the better of its one-thread AVX2 and AVX-512
figures), run once before the rounds if it is built (cargo build --release -p kolo-train --example
peak_flops); otherwise no peak column.

With --parallel (threads vs processes on one machine), instead, for --model (lenet or resnet18):
  procs-2     `kolo train -n 2`                     two worker processes, one compute thread each
  replicas-2  `kolo train -n 1 --replicas 2`        one process, two replica threads
  intra-2     `kolo train -n 1`, 2 compute threads  one replica, each op on two threads
all three with the same global batch per step (2 x --batch: 2 workers x B, 1 worker x 2B split in two,
1 worker x 2B), with samples/s and the peak memory (RSS summed over the job's processes, sampled
every 50 ms).

With --timeline (the cost of `kolo train --timeline FILE`), instead, alternating:
  off  `kolo train -n N`
  on   `kolo train -n N --timeline FILE`  (and the trace's size and event count)
with N = --workers (default 2); --bin picks the build (default target/release; target/debug for a
rough look with a debug build).

With --torch-backends (PyTorch on Gloo vs PyTorch on kolo's Python backend), instead, alternating:
  gloo  the PyTorch peer of --model with --workers workers (default 2), as above
  kolo  the same peer with its process group's backend "gloo" changed to "kolo" (nothing else; needs the
        kolo wheel installed in this Python, crates/kolo-py)
With --wrap fsdp both train under PyTorch's FSDP2 instead (fully_shard per block: parameters sharded, all-gathered
for forward and backward, gradients reduce-scattered; scripts/torch_ddp_resnet18.py's WRAP=fsdp, its LeNet too).
reporting samples/s, the time per step (per-worker batch / (samples/s / workers)) and kolo / Gloo.

With --device cuda (GPUs: `kolo train --device cuda` against PyTorch DDP on NCCL), instead, alternating:
  kolo-W   `kolo train -n W --device cuda` with KOLO_BACKEND=nccl (DDP's buckets on the GPU, to NCCL)
  torch-W  scripts/torch_ddp_resnet18.py with DEVICE=cuda (NCCL, TF32 off) and MODEL=--model
with W = --workers (at most one per GPU), the same model, batch, lr, momentum, epochs and data limits;
reporting samples/s (medians of --rounds) and kolo / PyTorch. Needs a build with the cuda and nccl features.

With --precision bf16 (mixed precision): kolo-N run `kolo train --precision bf16`, torch-N run PyTorch's
torch.autocast("cpu", dtype=torch.bfloat16) on the same model, batch and threads (scripts/torch_ddp_resnet18.py
with PRECISION=bf16, for LeNet too: MODEL=lenet); the plain candle loop (f32 only) is left out; each row's
GFLOP/s is also shown against the core's bf16 peak (AMX where the CPU has it, else AVX512-BF16: the
amx_bf16 / avx512_bf16 figures of BIN/examples/peak_flops; the f32 FMA peak where that is higher, as on
Intel Xeons without AMX, where kolo's bf16 computes in f32).

With --precision both, the two precisions in the same rounds: kolo-N and torch-N in f32, kolo-bf16-N and
torch-bf16-N in bf16 (as above), alternating; it reports bf16 / f32 of each and kolo / PyTorch in each
precision (the machine's speed drifts between invocations, so compare precisions within one).

With --baseline OLD_KOLO, OLD_KOLO's `kolo train -n 1` and `-n 2` run in the same rounds too (base-1,
base-2; with --precision both also in bf16, base-bf16-1, base-bf16-2), for a before/after comparison
under the same load.

Usage: scripts/bench_train.py [--model lenet|resnet18|mlp] [--rounds 3] [--batch B] [--epochs 1] [--train-limit N]
                              [--test-limit N] [--lr 0.05] [--momentum 0.9] [--peak-flops GFLOPS] [--no-torch]
                              [--baseline OLD_KOLO] [--bin target/release] [--precision f32|bf16|both]
       scripts/bench_train.py --parallel [--model resnet18] [--train-limit 2048] [--rounds 3]
       scripts/bench_train.py --timeline [--workers 2] [--train-limit 12800] [--bin target/debug]
       scripts/bench_train.py --torch-backends [--model lenet] [--workers 2] [--rounds 3]
Needs release builds (cargo build --release -p kolo-cli -p kolo-train --bins --example plain_loop --example
peak_flops) and the data (scripts/fetch-data.sh); PyTorch (pip install torch; numpy too for the LeNet peer) for the torch
rows: run the script with that Python (e.g. ~/.cache/kolo/torch-2.15.0/bin/python scripts/bench_train.py).
"""
import argparse, json, os, re, shutil, statistics, subprocess, sys, tempfile, time

import benchhost

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "..", "shared", "peers", "torch_ddp_lenet.py")
PEER_RESNET = os.path.join(ROOT, "scripts", "torch_ddp_resnet18.py")


def run(cmd, env=None):
    # kolo train sets this malloc tuning for its workers; give the plain loop and torch the same.
    tun = "glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295:glibc.malloc.hugetlb=1"
    e = dict(os.environ, RAYON_NUM_THREADS="1", GLIBC_TUNABLES=tun, **(env or {}))
    exe = cmd[0] if os.path.isabs(cmd[0]) else os.path.join(ROOT, cmd[0])
    if not os.path.isfile(exe):
        sys.exit(f"bench_train: {cmd[0]} is not built: cargo build --release -p kolo-cli -p kolo-train --bins "
                 "--example plain_loop --example peak_flops (or pass --bin for another build)")
    # Two retries: PyTorch's Gloo DDP now and then aborts in its teardown after a complete run
    # ("terminate called without an active exception", twice in a row once); the failure is
    # reported, never hidden.
    for attempt in (1, 2, 3):
        p = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True)
        if p.returncode == 0:
            return p.stdout
        msg = f"bench_train: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        if attempt == 3:
            sys.exit(msg)
        print(msg.splitlines()[0] + " -- running it again", file=sys.stderr, flush=True)


def plain(a):
    out = run([os.path.join(a.bin, "examples", "plain_loop"), "--model", a.model, "--batch-size", str(a.batch),
               "--epochs", str(a.epochs)] + (["--train-limit", str(a.train_limit)] if a.train_limit else []))
    return json.loads(out.strip().splitlines()[-1])["samples_per_s"]


def kolo(a, n, exe=None, precision=None):
    d = tempfile.mkdtemp(prefix="kolo-bench-")
    limits = (["--train-limit", str(a.train_limit)] if a.train_limit else []) + \
             (["--test-limit", str(a.test_limit)] if a.test_limit else [])
    try:
        run([exe or os.path.join(a.bin, "kolo"), "train", "-n", str(n), "--model", a.model, "--epochs", str(a.epochs),
             "--batch-size", str(a.batch), "--lr", str(a.lr), "--momentum", str(a.momentum), "--no-progress",
             "--out", d] + limits + (["--precision", "bf16"] if (precision or a.precision) == "bf16" else []))
        with open(os.path.join(d, "summary.json")) as f:
            return json.load(f)["samples_per_second"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def tree_rss_kb(root):
    """Resident memory of `root` and all its descendants, in KiB."""
    kids, rss = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/status") as f:
                kb = next((int(l.split()[1]) for l in f if l.startswith("VmRSS:")), 0)
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
        rss[int(d)] = kb
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += kids.get(p, [])
    return total


def kolo_parallel(a, n, replicas, threads, batch):
    """samples/s and peak RSS (MiB) of one `kolo train` run."""
    d = tempfile.mkdtemp(prefix="kolo-bench-")
    tun = "glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295:glibc.malloc.hugetlb=1"
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), GLIBC_TUNABLES=tun)
    cmd = [os.path.join(a.bin, "kolo"), "train", "-n", str(n), "--replicas", str(replicas), "--model", a.model,
           "--epochs", str(a.epochs), "--batch-size", str(batch), "--no-progress", "--out", d,
           "--test-limit", "500"] + (["--train-limit", str(a.train_limit)] if a.train_limit else [])
    try:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = 0
        while p.poll() is None:
            peak = max(peak, tree_rss_kb(p.pid))
            time.sleep(0.05)
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"bench_train: {' '.join(cmd)} failed ({p.returncode}):\n{out[-2000:]}\n{err[-2000:]}")
        with open(os.path.join(d, "summary.json")) as f:
            return json.load(f)["samples_per_second"], peak / 1024
    finally:
        shutil.rmtree(d, ignore_errors=True)


def parallel(a):
    b = a.batch
    cases = [("procs-2", (2, 1, 1, b)), ("replicas-2", (1, 2, 1, 2 * b)), ("intra-2", (1, 1, 2, 2 * b))]
    res = {name: [] for name, _ in cases}
    mem = {name: [] for name, _ in cases}
    for r in range(a.rounds):
        for name, (n, rep, thr, batch) in cases:
            t = time.time()
            sps, rss = kolo_parallel(a, n, rep, thr, batch)
            res[name].append(sps)
            mem[name].append(rss)
            print(f"round {r + 1} {name:10s} {sps:9.0f} samples/s  peak {rss:7.0f} MiB  ({time.time() - t:.0f} s)",
                  file=sys.stderr)
    med = {k: statistics.median(v) for k, v in res.items()}
    mmed = {k: statistics.median(v) for k, v in mem.items()}
    print(f"\n{a.model}, global batch {2 * a.batch} per step, {a.epochs} epoch(s), medians of {a.rounds} rounds:")
    for k in med:
        print(f"  {k:10s} {med[k]:9.0f} samples/s  peak RSS {mmed[k]:7.0f} MiB   (runs: {', '.join(f'{x:.0f}' for x in res[k])})")
    print(json.dumps({"model": a.model, "precision": a.precision, "medians": med, "peak_rss_mib": mmed, "runs": res, "batch": a.batch}))


def kolo_timeline(a, trace):
    """samples/s of one `kolo train` run, with a timeline written to `trace` unless it is None."""
    d = tempfile.mkdtemp(prefix="kolo-bench-")
    cmd = [os.path.join(a.bin, "kolo"), "train", "-n", str(a.workers), "--model", a.model,
           "--epochs", str(a.epochs), "--batch-size", str(a.batch), "--no-progress", "--out", d,
           "--test-limit", "1000"] + (["--train-limit", str(a.train_limit)] if a.train_limit else [])
    if trace:
        cmd += ["--timeline", trace]
    try:
        run(cmd)
        with open(os.path.join(d, "summary.json")) as f:
            return json.load(f)["samples_per_second"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def timeline(a):
    res = {"off": [], "on": []}
    trace = os.path.join(tempfile.mkdtemp(prefix="kolo-bench-"), "timeline.json")
    for r in range(a.rounds):
        # Alternate which goes first, so that a warming or cooling machine favours neither.
        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
        for name in order:
            t = time.time()
            res[name].append(kolo_timeline(a, trace if name == "on" else None))
            print(f"round {r + 1} {name:4s} {res[name][-1]:9.0f} samples/s  ({time.time() - t:.0f} s)", file=sys.stderr)
    with open(trace) as f:
        events = len(json.load(f)["traceEvents"])
    size = os.path.getsize(trace)
    shutil.rmtree(os.path.dirname(trace), ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"\n{a.model}, {a.workers} workers x batch {a.batch}, {a.epochs} epoch(s), {a.bin}, "
          f"medians of {a.rounds} rounds (samples/s):")
    for k, v in med.items():
        print(f"  timeline {k:4s} {v:9.0f}   (runs: {', '.join(f'{x:.0f}' for x in res[k])})")
    print(f"  cost of --timeline: {100 * (med['off'] / med['on'] - 1):+.1f} % time per sample; "
          f"trace {size / 1e6:.1f} MB, {events} events")
    print(json.dumps({"medians": med, "runs": res, "trace_bytes": size, "trace_events": events,
                      "workers": a.workers, "batch": a.batch, "train_limit": a.train_limit, "bin": a.bin}))


def torch(a, n, precision=None):
    env = {"MOMENTUM": str(a.momentum)}
    precision = precision or a.precision
    # bf16 (autocast) is the ResNet-18 peer's, which trains kolo's LeNet too (MODEL=lenet).
    own = a.model != "lenet" or precision == "bf16"
    if own:
        env.update(TRAIN_LIMIT=str(a.train_limit or 0), TEST_LIMIT=str(a.test_limit or 0), MODEL=a.model,
                   PRECISION=precision)
    out = run([sys.executable, PEER_RESNET if own else PEER, str(n), str(a.epochs), str(a.batch),
               str(a.lr)], env=env)
    rates = [float(m) for m in re.findall(r"samples_s (\d+(?:\.\d+)?)", out)]
    if not rates:
        sys.exit(f"bench_train: no samples/s in the torch peer's output:\n{out}")
    return statistics.median(rates)


def gpu(a):
    """kolo train --device cuda against PyTorch DDP on NCCL, alternating (see the module doc)."""
    limits = (["--train-limit", str(a.train_limit)] if a.train_limit else []) + \
             (["--test-limit", str(a.test_limit)] if a.test_limit else [])
    env = {"MOMENTUM": str(a.momentum), "MODEL": a.model, "DEVICE": "cuda",
           "TRAIN_LIMIT": str(a.train_limit or 0), "TEST_LIMIT": str(a.test_limit or 0)}

    def kolo_gpu():
        d = tempfile.mkdtemp(prefix="kolo-bench-")
        try:
            run([os.path.join(a.bin, "kolo"), "train", "-n", str(a.workers), "--device", "cuda", "--model", a.model,
                 "--epochs", str(a.epochs), "--batch-size", str(a.batch), "--lr", str(a.lr), "--momentum",
                 str(a.momentum), "--no-progress", "--out", d] + limits, env={"KOLO_BACKEND": "nccl"})
            with open(os.path.join(d, "summary.json")) as f:
                s = json.load(f)
            return s["samples_per_second"], s.get("final_accuracy")
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def torch_gpu():
        out = run([sys.executable, PEER_RESNET, str(a.workers), str(a.epochs), str(a.batch), str(a.lr)], env=env)
        summary = json.loads(out.strip().splitlines()[-1])
        return summary["train_samples_per_s"], summary["final_acc"]

    rows = {f"kolo-{a.workers}": kolo_gpu, f"torch-{a.workers}": torch_gpu}
    res = {k: [] for k in rows}
    acc = {k: [] for k in rows}
    for r in range(a.rounds):
        order = list(rows) if r % 2 == 0 else list(rows)[::-1]
        for name in order:
            t = time.time()
            sps, accuracy = rows[name]()
            res[name].append(sps)
            acc[name].append(accuracy)
            print(f"round {r + 1} {name:8s} {sps:9.0f} samples/s  accuracy {accuracy}  ({time.time() - t:.0f} s)",
                  file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    kolo_row, torch_row = list(rows)
    print(f"\n{a.model} on GPU, {a.workers} worker(s) x batch {a.batch}, {a.epochs} epoch(s), train limit "
          f"{a.train_limit or 'all'}, medians of {a.rounds} rounds (samples/s):")
    for k in med:
        print(f"  {k:8s} {med[k]:9.0f}   (runs: {', '.join(f'{x:.0f}' for x in res[k])}; accuracy {acc[k]})")
    print(f"  kolo / PyTorch DDP (NCCL): {med[kolo_row] / med[torch_row]:.3f}x")
    print(json.dumps({"device": "cuda", "model": a.model, "workers": a.workers, "batch": a.batch, "epochs": a.epochs,
                      "train_limit": a.train_limit, "medians": med, "runs": res, "accuracy": acc,
                      "kolo_over_torch": med[kolo_row] / med[torch_row]}))


def peer_with_backend(path, backend):
    """A copy of the PyTorch peer at `path` whose process group uses `backend` instead of Gloo."""
    with open(path) as f:
        text = f.read()
    patched = text.replace('dist.init_process_group("gloo"', f'dist.init_process_group("{backend}"')
    if patched == text:
        sys.exit(f'bench_train: {path} no longer calls dist.init_process_group("gloo", ...)')
    f = tempfile.NamedTemporaryFile("w", prefix=f"peer_{backend}_", suffix=".py", delete=False)
    with f:
        f.write(patched)
    return f.name


def torch_backends(a):
    peer = PEER_RESNET if a.model == "resnet18" else PEER
    env = {"MOMENTUM": str(a.momentum), "WRAP": a.wrap}
    if a.wrap == "fsdp" and a.model == "lenet":
        peer = PEER_RESNET  # the LeNet peer of ../shared/peers has no FSDP; this one has kolo's LeNet
        env["MODEL"] = "lenet"
    if a.model == "resnet18":
        env.update(TRAIN_LIMIT=str(a.train_limit or 0), TEST_LIMIT=str(a.test_limit or 0))
    scripts = {"gloo": peer, "kolo": peer_with_backend(peer, "kolo")}
    res = {"gloo": [], "kolo": []}
    try:
        for r in range(a.rounds):
            order = ["gloo", "kolo"] if r % 2 == 0 else ["kolo", "gloo"]
            for name in order:
                t = time.time()
                out = run([sys.executable, scripts[name], str(a.workers), str(a.epochs), str(a.batch), str(a.lr)],
                          env=env)
                rates = [float(m) for m in re.findall(r"samples_s (\d+(?:\.\d+)?)", out)]
                if not rates:
                    sys.exit(f"bench_train: no samples/s in the {name} run's output:\n{out}")
                res[name].append(statistics.median(rates))
                print(f"round {r + 1} {name:4s} {res[name][-1]:9.0f} samples/s  ({time.time() - t:.0f} s)",
                      file=sys.stderr)
    finally:
        os.unlink(scripts["kolo"])
    med = {k: statistics.median(v) for k, v in res.items()}
    step = {k: 1000 * a.batch * a.workers / v for k, v in med.items()}
    print(f"\nPyTorch {a.wrap.upper()} {a.model}, {a.workers} workers x batch {a.batch}, {a.epochs} epoch(s), medians of "
          f"{a.rounds} rounds:")
    for k in med:
        print(f"  torch on {k:4s} {med[k]:9.0f} samples/s  {step[k]:7.2f} ms per step   "
              f"(runs: {', '.join(f'{x:.0f}' for x in res[k])})")
    print(f"  kolo / Gloo: {med['kolo'] / med['gloo']:.3f}x samples/s; step time {step['kolo']:.2f} vs "
          f"{step['gloo']:.2f} ms")
    print(json.dumps({"model": a.model, "wrap": a.wrap, "workers": a.workers, "batch": a.batch, "medians": med, "runs": res,
                      "step_ms": step}))


def flops_per_sample(model):
    """Training FLOPs per sample of `model`, counted by the ResNet-18 peer (FlopCounterMode; it also has the LeNet)."""
    out = run([sys.executable, PEER_RESNET, "--flops", model])
    return json.loads(out.strip().splitlines()[-1])["train_flops_per_sample"]


def peak_per_core(a):
    """(per-core f32 FMA peak in GFLOP/s, where it comes from, the core's bf16 peak or None), or (None, why not,
    None)."""
    if a.peak_flops:
        return a.peak_flops, "--peak-flops", None
    probe = os.path.join(a.bin, "examples", "peak_flops")
    if not os.path.exists(os.path.join(ROOT, probe)):
        return (None, f"no {probe} (cargo build --release -p kolo-train --example peak_flops) and no --peak-flops",
                None)
    p = json.loads(run([probe, "--repeats", "3"]).strip().splitlines()[-1])
    f32 = p["peak_gflops_per_core"]
    bf16 = p.get("amx_bf16_gflops_per_core") or p.get("avx512_bf16_gflops_per_core")
    # bf16 work's peak is the faster of the bf16 unit and the f32 FMAs: an AVX512-BF16 unit slower than
    # the FMAs (Intel Xeons without AMX) is not what bounds a bf16 run, which then computes in f32.
    return f32, probe, max(bf16, f32) if bf16 else None


def write_plot(a, med, name):
    """Median samples/s against workers, one column per implementation, to a.csv; `kolo plot` draws
    it into the PNG beside it."""
    cols = [("kolo", "kolo-{}"), ("PyTorch DDP", "torch-{}")]
    if a.baseline:
        cols.append(("kolo --baseline", "base-{}"))
    cols = [(label, key) for label, key in cols if key.format(1) in med]
    with open(a.csv, "w") as f:
        f.write(",".join(["workers"] + [label for label, _ in cols]) + "\n")
        for w in (1, 2):
            f.write(",".join([str(w)] + [f"{med[key.format(w)]:.1f}" for _, key in cols]) + "\n")
    title = (f"{name} / Fashion-MNIST, batch {a.batch} per worker, medians of {a.rounds} rounds — "
             f"{benchhost.cpu_model()}")
    subprocess.run([os.path.join(a.bin, "kolo"), "plot", a.csv, "--out",
                    os.path.splitext(a.csv)[0] + ".png", "--title", title,
                    "--y-desc", "samples/s"], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, help="per worker (default 64; 32 for resnet18 without --parallel or "
                                              "--timeline)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--parallel", action="store_true", help="threads vs processes (see above)")
    ap.add_argument("--model", default="lenet", help="lenet, resnet18 or mlp (--parallel, --timeline: any kolo "
                                                   "model)")
    ap.add_argument("--train-limit", type=int, help="train on the first N samples (default: all; 2048 for "
                                                    "resnet18 without --parallel or --timeline)")
    ap.add_argument("--test-limit", type=int, help="evaluate on the first N test samples (default: all; 256 "
                                                   "for resnet18; --parallel and --timeline use 500 and 1000)")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD learning rate of kolo and torch (default 0.05)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum of kolo and torch (default 0.9)")
    ap.add_argument("--peak-flops", type=float, metavar="GFLOPS",
                    help="per-core f32 peak in GFLOP/s (default: run BIN/examples/peak_flops if built)")
    ap.add_argument("--timeline", action="store_true", help="the cost of --timeline (see above)")
    ap.add_argument("--torch-backends", action="store_true", help="PyTorch DDP on Gloo vs on kolo (see above)")
    ap.add_argument("--wrap", default="ddp", choices=["ddp", "fsdp"],
                    help="with --torch-backends: PyTorch's DDP, or FSDP2 (fully_shard, ZeRO-3; see above)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--csv", help="(the kolo/PyTorch comparison) also write the median samples/s of kolo "
                                  "and PyTorch DDP at 1 and 2 workers here, and draw it beside as a PNG "
                                  "with `kolo plot`")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: kolo train --device cuda against PyTorch DDP on NCCL (see above)")
    ap.add_argument("--bin", default="target/release", help="where the kolo binary and the examples are")
    ap.add_argument("--baseline", help="an older kolo binary: its kolo-1 and kolo-2 run in the same "
                                       "rounds, as base-1 and base-2 (a before/after comparison)")
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16", "both"],
                    help="bf16: kolo's --precision bf16 against PyTorch's bf16 autocast; both: the two "
                         "precisions in the same rounds (see above)")
    a = ap.parse_args()
    compare = not (a.parallel or a.timeline)
    if a.batch is None:
        a.batch = 32 if compare and a.model == "resnet18" else 64
    if a.train_limit is None:
        a.train_limit = 2048 if compare and a.model == "resnet18" else 0
    if a.test_limit is None:
        a.test_limit = 256 if compare and a.model == "resnet18" else 0
    if a.parallel:
        return parallel(a)
    if a.timeline:
        return timeline(a)
    if a.torch_backends:
        return torch_backends(a)
    if a.device == "cuda":
        return gpu(a)
    if a.model not in ("lenet", "resnet18", "mlp"):
        ap.error(f"--model {a.model}: the comparison with PyTorch has lenet, resnet18 and mlp")
    # The LeNet peer reads the data with numpy; the ResNet-18 peer needs torch only.
    need = "torch, numpy" if a.model == "lenet" else "torch"
    have_torch = not a.no_torch and subprocess.run([sys.executable, "-c", f"import {need}"],
                                                   capture_output=True).returncode == 0
    if not a.no_torch and not have_torch:
        print(f"bench_train: {sys.executable} cannot import {need}; skipping the torch rows and the FLOPs count "
              "(pip install torch numpy, or run this script with the Python that has them)", file=sys.stderr)
    if a.model == "lenet" and a.train_limit and have_torch:
        print("bench_train: the LeNet peer ignores --train-limit (trains on all 60,000 samples)", file=sys.stderr)
    flops = flops_per_sample(a.model) if have_torch else None
    peak, peak_src, bf16_peak = peak_per_core(a) if flops else (None, "no FLOPs count", None)
    if flops and peak is None:
        print(f"bench_train: no FMA peak: {peak_src}", file=sys.stderr)
    cases = [("plain", lambda: plain(a))] if a.precision == "f32" else []
    both = a.precision == "both"
    first = "f32" if both else a.precision
    cases += [("kolo-1", lambda: kolo(a, 1, precision=first)), ("kolo-2", lambda: kolo(a, 2, precision=first))]
    if both:
        cases += [("kolo-bf16-1", lambda: kolo(a, 1, precision="bf16")),
                  ("kolo-bf16-2", lambda: kolo(a, 2, precision="bf16"))]
    if a.baseline:
        cases += [("base-1", lambda: kolo(a, 1, a.baseline, first)), ("base-2", lambda: kolo(a, 2, a.baseline, first))]
        if both:
            cases += [("base-bf16-1", lambda: kolo(a, 1, a.baseline, "bf16")),
                      ("base-bf16-2", lambda: kolo(a, 2, a.baseline, "bf16"))]
    if have_torch:
        cases += [("torch-1", lambda: torch(a, 1, first)), ("torch-2", lambda: torch(a, 2, first))]
        if both:
            cases += [("torch-bf16-1", lambda: torch(a, 1, "bf16")), ("torch-bf16-2", lambda: torch(a, 2, "bf16"))]
    host, busy_before = benchhost.describe()
    res = {name: [] for name, _ in cases}
    for r in range(a.rounds):
        for name, f in cases:
            t = time.time()
            res[name].append(f())
            print(f"round {r + 1} {name:8s} {res[name][-1]:9.0f} samples/s  ({time.time() - t:.0f} s)", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in res.items()}
    # Busy cores of a row: its workers, one compute thread each.
    busy = {k: 2 if k.endswith("-2") else 1 for k in med}
    gflops = {k: v * flops / busy[k] / 1e9 for k, v in med.items()} if flops else {}
    name = {"lenet": "LeNet", "resnet18": "ResNet-18", "mlp": "MLP"}[a.model]
    limit = f"first {a.train_limit} samples" if a.train_limit else "all samples"
    print(f"\n{host}")
    print(f"{name} / Fashion-MNIST, {a.precision}, batch {a.batch} per worker, {a.epochs} epoch(s) of the {limit}, SGD lr {a.lr} "
          f"momentum {a.momentum}, medians of {a.rounds} rounds (samples/s):")
    if flops:
        print(f"  training FLOPs per sample {flops / 1e6:.2f} M; "
              + (f"f32 FMA peak {peak:.1f} GFLOP/s per core ({peak_src})" if peak else "no FMA peak")
              + (f"; bf16 peak {bf16_peak:.1f} GFLOP/s per core" if bf16_peak and a.precision != "f32" else ""))
    for k, v in med.items():
        g = ""
        if flops:
            bf16_row = a.precision == "bf16" or "bf16" in k
            g = f"  {gflops[k]:7.2f} GFLOP/s per core"
            if bf16_row and bf16_peak:
                g += f" ({100 * gflops[k] / bf16_peak:4.2f} % of the bf16 peak)"
            elif peak and not bf16_row:
                g += f" ({100 * gflops[k] / peak:4.1f} % of the f32 peak)"
        print(f"  {k:12s} {v:9.0f}{g}   (runs: {', '.join(f'{x:.0f}' for x in res[k])})")
    if "plain" in med:
        print(f"  Ddp overhead, 1 worker vs plain candle loop: {100 * (med['plain'] / med['kolo-1'] - 1):+.1f} %")
    print(f"  scaling efficiency, 2 workers: {100 * med['kolo-2'] / (2 * med['kolo-1']):.0f} %")
    if a.baseline:
        print(f"  this build / --baseline: 1 worker {med['kolo-1'] / med['base-1']:.3f}x, "
              f"2 workers {med['kolo-2'] / med['base-2']:.3f}x")
        if both:
            print(f"  this build / --baseline in bf16: 1 worker {med['kolo-bf16-1'] / med['base-bf16-1']:.3f}x, "
                  f"2 workers {med['kolo-bf16-2'] / med['base-bf16-2']:.3f}x")
    ratios = {}
    if have_torch:
        ratios = {"1": med["kolo-1"] / med["torch-1"], "2": med["kolo-2"] / med["torch-2"]}
        print(f"  kolo / PyTorch DDP ({name}): 1 worker {ratios['1']:.2f}x, 2 workers {ratios['2']:.2f}x")
        print(f"  PyTorch scaling efficiency, 2 workers: {100 * med['torch-2'] / (2 * med['torch-1']):.0f} %")
        if both:
            ratios.update({"bf16-1": med["kolo-bf16-1"] / med["torch-bf16-1"],
                           "bf16-2": med["kolo-bf16-2"] / med["torch-bf16-2"]})
            print(f"  kolo / PyTorch in bf16 (autocast): 1 worker {ratios['bf16-1']:.2f}x, "
                  f"2 workers {ratios['bf16-2']:.2f}x")
            print(f"  PyTorch bf16 / f32: 1 worker {med['torch-bf16-1'] / med['torch-1']:.2f}x, "
                  f"2 workers {med['torch-bf16-2'] / med['torch-2']:.2f}x")
    if both:
        print(f"  kolo bf16 / f32: 1 worker {med['kolo-bf16-1'] / med['kolo-1']:.2f}x, "
              f"2 workers {med['kolo-bf16-2'] / med['kolo-2']:.2f}x")
    if a.csv:
        write_plot(a, med, name)
    print(json.dumps({"model": a.model, "precision": a.precision, "medians": med, "runs": res, "batch": a.batch, "epochs": a.epochs,
                      "train_limit": a.train_limit, "test_limit": a.test_limit, "lr": a.lr, "momentum": a.momentum,
                      "kolo_over_torch": ratios, "train_flops_per_sample": flops, "gflops_per_core": gflops,
                      "busy_cores": busy, "peak_gflops_per_core": peak, "bf16_peak_gflops_per_core": bf16_peak,
                      "peak_source": peak_src if peak else None, "host": host,
                      "cores_busy_before": busy_before}))


if __name__ == "__main__":
    main()
