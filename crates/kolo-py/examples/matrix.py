"""Scatter, all-reduce and all-gather on a small array (the classic mpi4py example, one import
changed): rank 0 builds 0..7 and scatters it; every rank sums its part and squares it; the sums are
all-reduced and the squares all-gathered; rank 0 prints `sum: 28.0` and the squares.

    kolo run -n 4 -- python crates/kolo-py/examples/matrix.py
    torchrun --nproc_per_node 2 crates/kolo-py/examples/matrix.py
"""
import numpy as np

from kolo import MPI

N = 8
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
if N % size:
    raise SystemExit(f"rank {rank}: world size {size} does not divide {N}; run 1, 2, 4 or 8 ranks")

chunks = np.array_split(np.arange(N, dtype=np.float64), size) if rank == 0 else None
part = comm.scatter(chunks, root=0)          # objects, as in mpi4py
print(f"rank {rank} part: {part}", flush=True)

total = comm.allreduce(part.sum(), op=MPI.SUM)
squares = np.concatenate(comm.allgather(part**2))

buf = part.copy()                            # the same with buffers
comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

if rank == 0:
    print(f"sum: {total}", flush=True)
    print(f"squares: {' '.join(f'{v:g}' for v in squares)}", flush=True)
    print(f"part sums (buffer all-reduce): {buf}", flush=True)
