#!/usr/bin/env python3
"""kolo on MPI against raw OpenMPI: the overhead of kolo's layer over MPI_Allreduce.

    python3 scripts/compare_mpi.py [--n 2] [--rounds 5] [--kolo target/release/kolo]

Needs a kolo built with the MPI backend (cargo build --release -p kolo-cli --features mpi). Each
round runs, in turn, the OpenMPI peer (../shared/peers/run-openmpi.sh: MPI_Allreduce out of place,
f32 sum), the same in place (scripts/mpi_allreduce_inplace.c, MPI_IN_PLACE like kolo) and
`kolo bench allreduce --backend mpi` (kolo's all_reduce on MPI: argument checks, the call agreement,
MPI_Allreduce in place), all under mpirun with its default binding, same sizes, iterations and
warm-up. The table shows medians over the rounds and kolo-mpi's time relative to each; the target is
at most 5 % more time than OpenMPI's from 1 MiB up. `--no-agree` sets KOLO_CONFIRM_CALLS=0 for kolo, to
show what the agreement step costs.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_peers import PEERS, ROOT, SIZES, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kolo", default=os.path.join(ROOT, "target", "release", "kolo"))
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--no-agree", action="store_true")
    args = ap.parse_args()
    n, sizes = str(args.n), [str(s) for s in SIZES]
    kolo_env = {"KOLO_CONFIRM_CALLS": "0"} if args.no_agree else {}
    inplace = os.path.join(tempfile.mkdtemp(), "mpi_allreduce_inplace")
    subprocess.run(["mpicc", "-O2", os.path.join(ROOT, "scripts", "mpi_allreduce_inplace.c"), "-o", inplace],
                   check=True)
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else ["mpirun"]
    impls = {
        "openmpi": (["bash", os.path.join(PEERS, "run-openmpi.sh"), n] + sizes, None),
        "openmpi-inplace": (mpirun + ["-n", n, inplace] + sizes, None),
        "kolo-mpi": ([args.kolo, "bench", "allreduce", "--backend", "mpi", "-n", n, "--json",
                      "--dtype", args.dtype, "--sizes", ",".join(sizes)], kolo_env),
    }
    results = {k: {} for k in impls}
    for rnd in range(args.rounds):
        for name, (cmd, env) in impls.items():
            rows, err = run(cmd, env)
            if rows is None:
                sys.exit(f"{name} did not run: {err}")
            for b, r in rows.items():
                if r.get("wrong", 0):
                    sys.exit(f"{name}: {r['wrong']} wrong elements at {b} bytes")
                results[name].setdefault(b, []).append(r["time_us"])
            print(f"# round {rnd + 1}: {name} done", file=sys.stderr)

    print(f"all-reduce {args.dtype} sum, n = {args.n}, medians of {args.rounds} rounds"
          f"{' (kolo without the agreement step)' if args.no_agree else ''}")
    print("| bytes | OpenMPI (us) | OpenMPI in place (us) | kolo-mpi (us) | kolo-mpi / OpenMPI "
          "| kolo-mpi / in place | kolo-mpi busbw (GB/s) |")
    print("|---|---|---|---|---|---|---|")
    worst = {"openmpi": 0.0, "openmpi-inplace": 0.0}
    for b in sorted(results["kolo-mpi"]):
        t = {name: statistics.median(results[name][b]) for name in impls}
        k = t["kolo-mpi"]
        bus = b / k / 1e3 * 2 * (args.n - 1) / args.n
        print(f"| {b} | {t['openmpi']:.2f} | {t['openmpi-inplace']:.2f} | {k:.2f} | "
              f"{k / t['openmpi']:.3f} | {k / t['openmpi-inplace']:.3f} | {bus:.3f} |")
        if b >= 1 << 20:
            for name in worst:
                worst[name] = max(worst[name], k / t[name])
    for name, w in worst.items():
        verdict = "met" if w <= 1.05 else "NOT met"
        print(f"target (kolo-mpi time <= 1.05x {name}'s from 1 MiB): {verdict} (worst {w:.3f}x)")


if __name__ == "__main__":
    main()
