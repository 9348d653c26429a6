"""kolo's communicator on numpy arrays, without torch: an all-reduce in place, an asynchronous
broadcast and an object collective. Checks its results and exits non-zero when they are wrong.

    kolo run -n 2 -- python crates/kolo-py/examples/numpy_comm.py
    python crates/kolo-py/examples/numpy_comm.py          # alone: a world of one
"""
import sys

import numpy as np

import kolo

# ANCHOR: comm
comm = kolo.init()                          # under kolo run, torchrun or srun; a world of one alone
x = np.full(1000, comm.rank, np.float32)
comm.all_reduce(x)                          # in place; op="sum"|"prod"|"min"|"max"|"avg"
w = comm.broadcast(x, root=0, async_op=True); w.wait()
everyone = comm.all_gather_object({"rank": comm.rank})
# ANCHOR_END: comm

total = sum(range(comm.size))
if not (x == total).all() or everyone != [{"rank": r} for r in range(comm.size)]:
    print(f"rank {comm.rank}: wrong results: {x[:3]} ..., {everyone}", file=sys.stderr)
    sys.exit(1)
print(f"rank {comm.rank} of {comm.size}: all-reduce {x[0]:g}, objects from {len(everyone)} ranks", flush=True)
