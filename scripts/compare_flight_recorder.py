#!/usr/bin/env python3
"""kolo's flight recorder and PyTorch's, side by side, on the same hang.

    python3 scripts/compare_flight_recorder.py [--backends kolo,gloo,nccl] [--nproc 3]
        [--timeout 10] [--kolo target/release/kolo] [--python /path/to/python-with-torch]

The same program runs under torchrun once per backend: every rank all-reduces a 65,536-float
tensor and enters a barrier, eight times; the last rank gets stuck in its own code (a sleep) before
its sixth all-reduce, and the others wait in it until the process group's timeout (--timeout s).
Each backend's recorder is switched on as its documentation says:

- kolo (`import kolo.torch`, backend "kolo"): on by default; every rank writes its record into
  KOLO_TRACE_DIR when the world fails (the stuck rank too), and `kolo diagnose DIR` reads them;
- gloo and nccl: PyTorch's flight recorder (TORCH_FR_BUFFER_SIZE=2000, TORCH_FR_DUMP_ON_TIMEOUT=1,
  TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_FR_DUMP_TEMP_FILE=DIR/rank_), read with PyTorch's analyzer
  (`python -m torch.distributed.flight_recorder.fr_trace DIR`, the `torchfrtrace` command; again
  with --allow-incomplete-ranks where it refuses). Where a torch backend does not dump on a timeout
  (Gloo), the program does what a user can: a rank that catches the error writes its own record
  (`torch._C._distributed_c10d._dump_fr_trace()`); the stuck rank never gets there.

For each backend it prints the errors the ranks raised, the record files written and what the
analyzer says. nccl needs a GPU (all ranks share GPU 0: NCCL_HOSTID per rank, NCCL over its socket
transport on loopback); it is left out, and said so, without one.
"""
import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(backend, steps=8, stuck_at=5):
    import torch
    import torch.distributed as dist

    if backend == "kolo":
        import kolo.torch  # noqa: F401  registers the backend
    rank = int(os.environ["RANK"])
    cuda = backend == "nccl"
    if cuda:
        os.environ["NCCL_HOSTID"] = f"fr-compare-{rank}"
    timeout = datetime.timedelta(seconds=float(os.environ["FR_COMPARE_TIMEOUT"]))
    dist.init_process_group(
        backend, timeout=timeout, device_id=torch.device("cuda", 0) if cuda else None
    )
    x = torch.ones(1 << 16, device="cuda" if cuda else "cpu")
    last = dist.get_world_size() - 1
    try:
        for step in range(steps):
            if rank == last and step == stuck_at:
                time.sleep(300)  # stuck in its own code (a data loader that never returns, say)
            dist.all_reduce(x)
            dist.barrier()
            if cuda:
                torch.cuda.synchronize()
    except Exception:
        if backend == "gloo":
            # Gloo does not dump on a timeout: what a user can add.
            import torch._C._distributed_c10d as c10d

            with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
                f.write(c10d._dump_fr_trace())
        raise
    print(f"rank {rank} finished")


def errors(output):
    """The error lines the ranks raised, one per rank and message."""
    seen, out = set(), []
    for line in output.splitlines():
        m = re.match(r"\[rank(\d+)\]:\s*([\w.]*(Error|Exception)\b.*)", line) or re.match(
            r"\[rank(\d+)\]:\[E[^\]]*\] (.*(Watchdog caught|timed out|Timeout).*)", line)
        if m and (m.group(1), m.group(2)) not in seen:
            seen.add((m.group(1), m.group(2)))
            out.append(f"rank {m.group(1)}: {m.group(2)}")
        elif line.startswith("kolo: flight record written") and line not in seen:
            seen.add(line)
            out.append(line)
    return out


def run(backend, args, python):
    trace = tempfile.mkdtemp(prefix=f"fr-{backend}-")
    env = dict(os.environ, FR_COMPARE_TIMEOUT=str(args.timeout), PYTHONUNBUFFERED="1")
    if backend == "kolo":
        env.update(KOLO_TRACE_DIR=trace, KOLO_TIMEOUT=str(args.timeout))
    else:
        env.update(
            TORCH_FR_BUFFER_SIZE="2000",
            TORCH_FR_DUMP_ON_TIMEOUT="1",
            TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
            TORCH_FR_DUMP_TEMP_FILE=os.path.join(trace, "rank_"),
        )
    if backend == "nccl":
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    cmd = [python, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.nproc}", os.path.abspath(__file__), "--worker", backend]
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout + 120)
        output, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        output, rc = (e.stdout or b"").decode() + (e.stderr or b"").decode(), "timeout"
    took = time.monotonic() - t
    print(f"\n=== {backend}: the job ended after {took:.1f} s (exit {rc})")
    print("--- what the ranks said")
    for line in errors(output) or ["(no error lines)"]:
        print("  " + line[:400])
    files = sorted(f for f in os.listdir(trace) if not f.startswith("."))
    print(f"--- records written: {', '.join(files) or 'none'}")
    if backend == "kolo":
        tools = [[args.kolo, "diagnose", trace]]
    else:
        fr = [python, "-m", "torch.distributed.flight_recorder.fr_trace", trace]
        tools = [fr, fr + ["--allow-incomplete-ranks"]]
    for tool in tools:
        print(f"--- {' '.join(os.path.basename(a) if a == trace else a for a in tool[-3:])}")
        try:
            a = subprocess.run(tool, capture_output=True, text=True, timeout=60)
            text = (a.stdout + a.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"could not run: {e}"
        lines = [ln for ln in text.splitlines() if "tabulate is not installed" not in ln]
        # A traceback is shown by its last line: the error the analyzer ended with.
        if any(ln.startswith("Traceback") for ln in lines):
            lines = ["(exits with) " + lines[-1]]
        for ln in lines[:40]:
            print("  " + ln[:400])
        if backend == "kolo" or a.returncode == 0:
            break
    shutil.rmtree(trace, ignore_errors=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="kolo,gloo,nccl")
    ap.add_argument("--nproc", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--kolo", default=os.path.join(ROOT, "target", "release", "kolo"))
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    info = subprocess.run(
        [args.python, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"],
        capture_output=True, text=True,
    ).stdout.split()
    if not info:
        sys.exit(f"compare_flight_recorder: no torch in {args.python} (--python)")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    print(f"torch {info[0]}; {args.nproc} ranks under torchrun; the last rank stuck before its "
          f"6th all-reduce; timeout {args.timeout:g} s; CPU: {cpu}")
    for backend in args.backends.split(","):
        if backend == "nccl" and info[1] != "True":
            print("\n=== nccl: left out (no GPU that torch can use here)")
            continue
        run(backend, args, args.python)


if __name__ == "__main__":
    main()
