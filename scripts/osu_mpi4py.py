#!/usr/bin/env python3
"""mpi4py's own demo programs on mpi4py + OpenMPI and on kolo.MPI, side by side.

    python3 scripts/osu_mpi4py.py [--runs 3] [--kolo target/release/kolo] [--demos osu_latency,...]
        [--venv ~/.cache/kolo/mpi4py-4.1.2] [--no-build]

Sets up what it needs, once (cached under ~/.cache/kolo): a venv with numpy and mpi4py 4.1.2
from PyPI, built against the system's OpenMPI (``apt-get install -y libopenmpi-dev openmpi-bin``
first if mpicc is missing; ``scripts/test.sh`` installs them); mpi4py's ``demo/`` directory from
its source distribution on PyPI (``pip download --no-binary mpi4py --no-deps mpi4py==4.1.2``,
extracted there — mpi4py's code is never copied into this repository); and kolo's wheel, built
with maturin (``--release``) from this checkout and installed into that venv (``--no-build``
keeps the one installed).

Each demo runs under ``mpirun -n 2`` (``--allow-run-as-root --oversubscribe`` as root) with
mpi4py, and under ``kolo run -n 2`` with ``from mpi4py import MPI`` rewritten to ``from kolo
import MPI`` — nothing else changed. Both run through the same small runner, which gives the
program a fixed stdin (the compute-pi demos read the number of intervals from it; kolo run gives
its workers none) and runs it as ``__main__``. cpi-dpm spawns its workers, so it runs with
``-n 1``. The two alternate, run after run, so that both see the same load on a shared machine.

``scripts/osu_allreduce.py`` (this repository's: mpi4py's demos have no all-reduce) runs the same
way, and a third time as a torch.distributed program on the kolo backend ("torch on kolo", with
--torch-python's torch and the same wheel), so the torch backend's all-reduce latency sits beside
mpi4py's Allreduce; a fourth time on a backend that communicates nothing ("torch, no
backend": torch's own cost of the call, the floor under any backend written in Python); a fifth
on torch's own C++ process group that communicates nothing ("torch, no C++ backend": the floor
under a backend written in C++, whose calls go through torch's dispatcher); and a sixth on Gloo,
torch's CPU backend.

The table says, per demo, whether each ran (exit status 0) and else the last line of its error;
for the OSU programs it gives rank 0's numbers per message size, the median of --runs runs, for
mpi4py and kolo.MPI and their ratio (kolo / mpi4py: latencies in µs, so below 1 is faster; the
bw/bibw programs print MB/s, so above 1 is faster). It prints the CPU model and the load average,
since timings on a shared machine move with it.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile

import benchhost

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPI4PY = "4.1.2"
CACHE = os.path.expanduser(os.environ.get("KOLO_CACHE", "~/.cache/kolo"))
DEMOS = [
    "helloworld.py",
    "osu_latency.py",
    "osu_bw.py",
    "osu_bibw.py",
    "osu_multi_lat.py",
    "osu_barrier.py",
    "osu_bcast.py",
    "osu_allgather.py",
    "osu_alltoall.py",
    "osu_alltoallv.py",
    "osu_gather.py",
    "osu_scatter.py",
    "osu_allreduce.py",
    "compute-pi/cpi-cco.py",
    "compute-pi/cpi-rma.py",
    "compute-pi/cpi-dpm.py",
]
NPROCS = {"compute-pi/cpi-dpm.py": 1}
# Programs of this repository run the same way (mpi4py's demos have no all-reduce); these also run
# as torch.distributed programs on the kolo backend ("torch-kolo") when --torch-python has torch.
LOCAL = {"osu_allreduce.py": os.path.join(HERE, "osu_allreduce.py")}
STDIN = "1000\n0\n"  # compute-pi: 1000 intervals, then 0 (quit)
RUNNER = """\
import io, runpy, sys
sys.stdin = io.StringIO({stdin!r})
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
RANK_PREFIX = re.compile(r"^\[rank (\d+)\] ")
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def sh(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)


def setup_venv(venv):
    """A venv with numpy and mpi4py (built against the system's OpenMPI)."""
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        sh([sys.executable, "-m", "venv", venv])
    probe = subprocess.run([py, "-c", "import numpy, mpi4py; print(mpi4py.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode == 0 and probe.stdout.strip() == MPI4PY:
        return py
    if shutil.which("mpicc") is None:
        sys.exit("osu_mpi4py: mpicc not found: apt-get install -y libopenmpi-dev openmpi-bin")
    sh([py, "-m", "pip", "install", "-q", "numpy"])
    sh([py, "-m", "pip", "install", "-q", "--no-binary", "mpi4py", f"mpi4py=={MPI4PY}"])
    return py


def demo_dir():
    """mpi4py's demo/ directory, from its sdist on PyPI (downloaded once)."""
    base = os.path.join(CACHE, "mpi4py")
    demo = os.path.join(base, f"mpi4py-{MPI4PY}", "demo")
    if os.path.isdir(demo):
        return demo
    os.makedirs(base, exist_ok=True)
    sdist = os.path.join(base, f"mpi4py-{MPI4PY}.tar.gz")
    if not os.path.exists(sdist):
        sh([sys.executable, "-m", "pip", "download", "-q", "--no-binary", "mpi4py", "--no-deps",
            f"mpi4py=={MPI4PY}", "-d", base])
    with tarfile.open(sdist) as t:
        members = [m for m in t.getmembers() if m.name.startswith(f"mpi4py-{MPI4PY}/demo/")]
        t.extractall(base, members=members, filter="data")
    return demo


def install_kolo(pys, build):
    if build:
        out = tempfile.mkdtemp(prefix="kolo-wheel-")
        py = pys[0]
        maturin = shutil.which("maturin") or os.path.join(os.path.dirname(py), "maturin")
        if not os.path.exists(maturin):
            sh([py, "-m", "pip", "install", "-q", "maturin>=1.9.4,<2"])
        sh([maturin, "build", "-q", "--release", "-m",
            os.path.join(ROOT, "crates", "kolo-py", "Cargo.toml"), "-o", out])
        wheels = [os.path.join(out, w) for w in os.listdir(out) if w.endswith(".whl")]
        for py in pys:
            sh([py, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps"] + wheels)
    for py in pys:
        probe = subprocess.run([py, "-c", "import kolo.MPI"], capture_output=True, text=True)
        if probe.returncode != 0:
            sys.exit(f"osu_mpi4py: kolo is not installed in {py}: {probe.stderr.strip()}")


def prepare(demo, demos, work):
    """(the mpi4py program, its kolo.MPI twin, the runner)."""
    runner = os.path.join(work, "runner.py")
    with open(runner, "w") as f:
        f.write(RUNNER.format(stdin=STDIN))
    progs = {}
    for name in demos:
        src = LOCAL.get(name) or os.path.join(demo, name)
        with open(src) as f:
            text = f.read()
        twin = text.replace("from mpi4py import MPI", "from kolo import MPI")
        if twin == text:
            sys.exit(f"osu_mpi4py: {name} no longer says 'from mpi4py import MPI'")
        dst = os.path.join(work, name.replace("/", "_"))
        with open(dst, "w") as f:
            f.write(twin)
        progs[name] = (src, dst)
    return runner, progs


def run_one(cmd, timeout):
    """(ok, rank 0's output lines, the last line of the error)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, [], f"timed out after {timeout} s"
    lines = []
    for line in p.stdout.splitlines():
        m = RANK_PREFIX.match(line)
        if m and m.group(1) != "0":
            continue
        lines.append(RANK_PREFIX.sub("", line))
    err = [RANK_PREFIX.sub("", ln) for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
    # The error a traceback ends with, else the last line.
    raised = [ln for ln in err if EXCEPTION.match(ln)]
    why = (raised or err or [f"exit status {p.returncode}"])[-1]
    return p.returncode == 0, lines, "" if p.returncode == 0 else why[:200]


def sizes(lines):
    """{message size: number} of an OSU program's output."""
    out = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            try:
                out[int(parts[0])] = float(parts[1])
            except ValueError:
                pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kolo", default=os.path.join(ROOT, "target", "release", "kolo"))
    ap.add_argument("--venv", default=os.path.join(CACHE, f"mpi4py-{MPI4PY}"))
    ap.add_argument("--demos", default=",".join(DEMOS))
    ap.add_argument("--no-build", action="store_true", help="keep the kolo wheel installed")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run of one demo")
    ap.add_argument("--torch-python", default=os.path.join(CACHE, "torch-2.15.0", "bin", "python"),
                    help="a Python with torch, for the torch-kolo runs of this repository's "
                         "programs (skipped if it has no torch; scripts/install-torch.sh makes it)")
    args = ap.parse_args()
    known = {os.path.basename(d).removesuffix(".py"): d for d in DEMOS}
    demos = []
    for name in args.demos.split(","):
        key = os.path.basename(name).removesuffix(".py")
        if key not in known:
            sys.exit(f"osu_mpi4py: unknown demo {name!r}; known: {', '.join(known)}")
        demos.append(known[key])

    py = setup_venv(args.venv)
    torch_py = args.torch_python if os.access(args.torch_python, os.X_OK) else None
    if torch_py and subprocess.run([torch_py, "-c", "import torch"],
                                   capture_output=True).returncode != 0:
        torch_py = None
    if torch_py is None:
        print(f"# no torch at {args.torch_python}: no torch-kolo runs", file=sys.stderr)
    install_kolo([py] + ([torch_py] if torch_py else []), not args.no_build)
    if not os.access(args.kolo, os.X_OK):
        sys.exit(f"osu_mpi4py: no kolo binary at {args.kolo} (cargo build --release -p kolo-cli)")
    work = tempfile.mkdtemp(prefix="osu-mpi4py-")
    runner, progs = prepare(demo_dir(), demos, work)
    mpirun = ["mpirun"] + (["--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else [])

    host, _ = benchhost.describe()
    results = {d: {"mpi4py": [], "kolo": []} for d in demos}
    for d in demos:
        if d in LOCAL and torch_py:
            results[d]["torch-kolo"] = []
            results[d]["torch-floor"] = []
            results[d]["torch-fake"] = []
            results[d]["torch-gloo"] = []
    for rnd in range(args.runs):
        for d in demos:
            n = str(NPROCS.get(d, 2))
            src, twin = progs[d]
            order = [("mpi4py", mpirun + ["-n", n, py, runner, src]),
                     ("kolo", [args.kolo, "run", "-n", n, "--", py, runner, twin])]
            if "torch-kolo" in results[d]:
                order.append(("torch-kolo",
                              [args.kolo, "run", "-n", n, "--", torch_py, runner, src, "--torch"]))
                for b in ("floor", "fake", "gloo"):
                    order.append((f"torch-{b}",
                                  [args.kolo, "run", "-n", n, "--", torch_py, runner, src,
                                   "--torch", "--backend", b]))
            if rnd % 2:
                order.reverse()
            for impl, cmd in order:
                results[d][impl].append(run_one(cmd, args.timeout))
            oks = {impl: results[d][impl][-1][0] for impl, _ in order}
            print(f"# run {rnd + 1}/{args.runs}: {d}: "
                  + ", ".join(f"{i} {'ok' if ok else 'failed'}" for i, ok in oks.items()),
                  file=sys.stderr)
        if rnd == 0:
            # A program that failed once is not run again.
            demos = [d for d in demos if all(r[0][0] for r in results[d].values())
                     or d.startswith("osu_")]

    mpi_version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True)
    print(host)
    print(f"mpi4py {MPI4PY} + {mpi_version.stdout.splitlines()[0] if mpi_version.stdout else '?'}"
          f" under mpirun -n 2; kolo.MPI under kolo run -n 2; medians of {args.runs} runs")
    print()
    print("| demo | mpi4py + OpenMPI | kolo.MPI |")
    print("|---|---|---|")
    for d, r in results.items():
        cells = []
        for impl in ("mpi4py", "kolo"):
            runs = r[impl]
            bad = [why for ok, _, why in runs if not ok]
            cells.append(f"ran ok ({len(runs)}/{len(runs)})" if not bad
                         else f"failed ({len(bad)}/{len(runs)}): {bad[0]}")
        print(f"| {d} | {cells[0]} | {cells[1]} |")
    for d, r in results.items():
        if not d.startswith("osu_"):
            continue
        per = {impl: [sizes(lines) for ok, lines, _ in r[impl] if ok] for impl in r}
        if not per["mpi4py"] or not per["kolo"]:
            continue
        others = [i for i in ("kolo", "torch-kolo", "torch-floor", "torch-fake", "torch-gloo")
                  if per.get(i)]
        unit = "MB/s" if d in ("osu_bw.py", "osu_bibw.py") else "µs"
        print()
        print(f"{d} ({unit}; medians of " + ", ".join(str(len(per[i])) for i in ["mpi4py"] + others)
              + " runs)")
        names = {"kolo": "kolo.MPI", "torch-kolo": "torch on kolo",
                 "torch-floor": "torch, no backend", "torch-fake": "torch, no C++ backend",
                 "torch-gloo": "torch on Gloo"}
        print(f"| size (B) | mpi4py ({unit}) | "
              + " | ".join(f"{names[i]} ({unit}) | {names[i]} / mpi4py" for i in others) + " |")
        print("|---|---|" + "---|---|" * len(others))
        for size in sorted(per["mpi4py"][0]):
            m = [s[size] for s in per["mpi4py"] if size in s]
            cols = [[s[size] for s in per[i] if size in s] for i in others]
            if not m or not all(cols):
                continue
            mm = statistics.median(m)
            cells = []
            for c in cols:
                km = statistics.median(c)
                cells.append(f"{km:.2f} | {km / mm:.2f}" if mm else f"{km:.2f} | -")
            print(f"| {size} | {mm:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
