#!/usr/bin/env python3
"""All-reduce latency in the output format of mpi4py's OSU demos (``size  latency_us``).

    mpirun -n 2 python osu_allreduce.py            # mpi4py
    kolo run -n 2 -- python osu_allreduce.py       # the same with `from kolo import MPI`
    kolo run -n 2 -- python osu_allreduce.py --torch   # torch.distributed on the kolo backend

mpi4py's demo/ directory has no all-reduce program; this one follows its osu_bcast.py: for each
size, a warm-up, a barrier, then `iterations` MPI_SUM all-reduces of float32 numpy buffers
(``comm.Allreduce(IN_PLACE, buf)``), the time per call averaged over the ranks. ``--torch`` runs
``torch.distributed.all_reduce`` on a float32 tensor of the same size instead, in a process group
of the backend "kolo" (``--backend`` picks another), so the torch backend's per-call cost is
measured the same way. ``--backend floor`` registers a backend that communicates nothing (its
all-reduce returns at once, as kolo's synchronous one does when it has finished): what is left is
torch's own cost of a ``dist.all_reduce`` call — the floor under any backend written in Python.
``--backend fake`` is torch's own C++ process group that communicates nothing
(``torch.testing._internal.distributed.fake_pg``): the floor under a backend written in C++.
``scripts/osu_mpi4py.py`` runs them beside the demos.
"""
import sys
import time

MAX_LOG = 20  # sizes 4 B .. 1 MiB
SKIP, LOOP = 100, 2000
SKIP_LARGE, LOOP_LARGE, LARGE = 10, 100, 8192


def sizes():
    s = 4
    while s <= 1 << MAX_LOG:
        yield s
        s *= 2


def run_mpi(MPI, np):
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if rank == 0:
        print("# OSU MPI Allreduce Latency Test (float32, sum)")
        print(f"# {'Size [B]':<10} {'Avg Latency [us]':>20}")
    buf = np.ones(1 << (MAX_LOG - 2), dtype=np.float32)
    for size in sizes():
        skip, loop = (SKIP_LARGE, LOOP_LARGE) if size > LARGE else (SKIP, LOOP)
        view = buf[: size // 4]
        comm.Barrier()
        for i in range(skip + loop):
            if i == skip:
                comm.Barrier()
                t0 = MPI.Wtime()
            comm.Allreduce(MPI.IN_PLACE, view, op=MPI.SUM)
        mine = (MPI.Wtime() - t0) * 1e6 / loop
        avg = comm.allreduce(mine, op=MPI.SUM) / comm.Get_size()
        if rank == 0:
            print(f"{size:<10d} {avg:>20.2f}", flush=True)


def register_floor(dist):
    """The backend "floor": a process group whose all-reduce does nothing and returns no work
    (torch then waits on none), and whose barrier does nothing either."""

    class Floor(dist.ProcessGroup):
        def allreduce(self, tensors, opts=None):
            return None

        def barrier(self, opts=None):
            return None

        def getBackendName(self):
            return "floor"

    dist.Backend.register_backend(
        "floor", lambda o, _=None: Floor(o.group_rank, o.group_size), extended_api=True,
        devices=["cpu"])


def run_torch(backend):
    import torch
    import torch.distributed as dist

    if backend == "floor":
        register_floor(dist)
    if backend == "fake":
        import os
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group(backend="fake", store=FakeStore(),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group(backend=backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# torch.distributed all_reduce latency, backend {backend!r} (float32, sum)")
        print(f"# {'Size [B]':<10} {'Avg Latency [us]':>20}")
    buf = torch.ones(1 << (MAX_LOG - 2), dtype=torch.float32)
    for size in sizes():
        skip, loop = (SKIP_LARGE, LOOP_LARGE) if size > LARGE else (SKIP, LOOP)
        view = buf[: size // 4]
        dist.barrier()
        for i in range(skip + loop):
            if i == skip:
                dist.barrier()
                t0 = time.perf_counter()
            dist.all_reduce(view)
        mine = torch.tensor([(time.perf_counter() - t0) * 1e6 / loop], dtype=torch.float64)
        if backend not in ("floor", "fake"):  # these sum nothing: rank 0's own time
            dist.all_reduce(mine)
            mine /= n
        if rank == 0:
            print(f"{size:<10d} {mine.item():>20.2f}", flush=True)
    dist.destroy_process_group()


def main():
    if "--torch" in sys.argv:
        backend = "kolo"
        if "--backend" in sys.argv:
            backend = sys.argv[sys.argv.index("--backend") + 1]
        run_torch(backend)
        return
    import numpy as np
    from mpi4py import MPI

    run_mpi(MPI, np)


if __name__ == "__main__":
    main()
