#!/usr/bin/env python3
"""kolo on MPI against raw OpenMPI: the overhead of kolo's layer over MPI_Allreduce.

    python3 scripts/compare_mpi.py [--n 2] [--rounds 5] [--kolo target/release/kolo]

Needs a kolo built with the MPI backend (cargo build --release -p kolo-cli --features mpi). Each
round runs, in turn, the OpenMPI peer (../shared/peers/run-openmpi.sh: MPI_Allreduce, f32 sum) and
`kolo bench allreduce --backend mpi` (kolo's all_reduce on MPI: argument checks, the call agreement,
MPI_Allreduce in place), both under mpirun with its default binding, same sizes, iterations and
warm-up. The table shows medians over the rounds and kolo-mpi's time relative to OpenMPI's; the
target is at most 5 % more time from 1 MiB up. `--no-agree` sets KOLO_CONFIRM_CALLS=0 for kolo, to
show what the agreement step costs.
"""
import argparse
import os
import statistics
import sys

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
    impls = {
        "openmpi": (["bash", os.path.join(PEERS, "run-openmpi.sh"), n] + sizes, None),
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
    print("| bytes | OpenMPI time (us) | kolo-mpi time (us) | kolo-mpi / OpenMPI | OpenMPI busbw | kolo-mpi busbw |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for b in sorted(results["openmpi"]):
        if b not in results["kolo-mpi"]:
            continue
        o = statistics.median(results["openmpi"][b])
        k = statistics.median(results["kolo-mpi"][b])
        bus = lambda t: b / t / 1e3 * 2 * (args.n - 1) / args.n
        print(f"| {b} | {o:.2f} | {k:.2f} | {k / o:.3f} | {bus(o):.3f} | {bus(k):.3f} |")
        if b >= 1 << 20:
            worst = max(worst, k / o)
    verdict = "met" if worst <= 1.05 else "NOT met"
    print(f"\ntarget (kolo-mpi time <= 1.05x OpenMPI's from 1 MiB): {verdict} (worst {worst:.3f}x)")


if __name__ == "__main__":
    main()
