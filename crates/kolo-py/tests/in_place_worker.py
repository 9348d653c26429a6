"""kolo.MPI's large sends between two processes (see test_mpi_in_place.py): run under `kolo run
-n 2` with a flag file's path and `in-place` or `buffered`; prints each rank's findings as JSON."""

import json
import os
import sys
import time

import numpy as np

from kolo import MPI

N = 1 << 20
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
flag = sys.argv[1]
out = {"rank": rank}
if rank == 0:
    big = np.zeros(2 * N, np.uint8)
    big[:N] = np.arange(N) % 251
    if sys.argv[2] == "buffered":
        # A buffered send longer than the ring waits for rank 1 to take its first part.
        open(flag, "w").close()
    req = comm.Isend([big, N, MPI.BYTE], 1, 1)
    # In place, rank 1 makes no kolo call until the flag file exists: nothing has copied it yet.
    out["pending"] = bool(req) and not req.Test()
    open(flag, "w").close()
    req.Wait()
    out["done"] = not bool(req)
    big[:N] = 7  # the buffer is free again: rank 1 has its copy
    # Both send first, then receive. `Send` returns once rank 1 has its copy: the buffer may
    # change at once.
    comm.Send([big, N, MPI.BYTE], 1, 2)
    big[:N] = 0
    back = np.zeros(N, np.uint8)
    comm.Recv(back, 1, 3)
    out["exchange"] = bool((back == 3).all())
    # A request dropped without a wait: its buffer is kept until rank 1 has copied it.
    tmp = np.full(N, 5, np.uint8)
    comm.Isend(tmp, 1, 4)
    del tmp
    # Sent in place, then an ordinary message: they arrive in order.
    comm.Isend(np.full(N, 6, np.uint8), 1, 5).Wait()
    comm.Send(np.full(10, 8, np.uint8), 1, 5)
    # Into a longer buffer (through the mailbox): the rest untouched.
    comm.Send(np.full(N, 9, np.uint8), 1, 6)
else:
    while not os.path.exists(flag):
        time.sleep(0.01)
    got, st = np.full(N + 16, 255, np.uint8), MPI.Status()
    comm.Recv([got, N, MPI.BYTE], 0, 1, st)
    out["bytes"] = bool((got[:N] == np.arange(N) % 251).all())
    out["rest"] = bool((got[N:] == 255).all()) and st.Get_count() == N
    comm.Send(np.full(N, 3, np.uint8), 0, 3)
    time.sleep(0.1)  # rank 0's Send of tag 2 waits for this rank's copy meanwhile
    back = np.zeros(N, np.uint8)
    comm.Recv(back, 0, 2)
    out["exchange"] = bool((back == 7).all())
    time.sleep(0.2)
    dropped = np.zeros(N, np.uint8)
    comm.Recv(dropped, 0, 4)
    out["dropped"] = bool((dropped == 5).all())
    a, b = np.zeros(N, np.uint8), np.zeros(10, np.uint8)
    comm.Recv(a, 0, 5)
    comm.Recv(b, 0, 5)
    out["order"] = bool((a == 6).all() and (b == 8).all())
    longer = np.full(N + 100, 255, np.uint8)
    comm.Recv(longer, 0, 6, st)
    out["longer"] = bool((longer[:N] == 9).all() and (longer[N:] == 255).all()) and st.count == N
print(json.dumps(out), flush=True)
