"""kolo.MPI's receives posted at Irecv, between two processes (see test_mpi_posted.py): run under
`kolo run -n 2`; prints each rank's findings as JSON."""

import json

import numpy as np

import kolo
from kolo import MPI

N = 1 << 20
comm = MPI.COMM_WORLD
rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
out = {"rank": rank}


def data(n, salt):
    return (np.arange(n) * 7 + salt) % 251


# 1. Filled by any kolo call that moves messages: the bytes are there before Wait.
if rank == 0:
    comm.Send(data(5000, 1).astype(np.uint8), 1, 1)
    comm.Barrier()
else:
    buf = np.full(6000, 255, np.uint8)
    req = comm.Irecv([buf, 6000, MPI.BYTE], 0, 1)
    comm.Barrier()  # moves the message into the posted buffer
    out["before_wait"] = bool((buf[:5000] == data(5000, 1)).all())
    st = MPI.Status()
    req.Wait(st)
    out["count"] = st.Get_count(MPI.BYTE)
    out["rest"] = bool((buf[5000:] == 255).all())

# 2. MPI's matching order with a wildcard receive between two posted ones, waited on backwards.
if rank == 0:
    for salt in (2, 3, 4):
        comm.Send(data(8000, salt).astype(np.uint8), 1, 2)
else:
    a, w, b = (np.zeros(8000, np.uint8) for _ in range(3))
    ra = comm.Irecv(a, 0, 2)
    rw = comm.Irecv(w, MPI.ANY_SOURCE, 2)
    rb = comm.Irecv(b, 0, 2)
    for r in (rb, rw, ra):
        r.Wait()
    out["order"] = [bool((x == data(8000, s)).all()) for x, s in ((a, 2), (w, 3), (b, 4))]

# 3. Both ranks post, send a window of large messages (in place) and wait: every byte right.
recv = [np.zeros(N, np.uint8) for _ in range(8)]
reqs = [comm.Irecv(r, peer, 3) for r in recv]
send = [data(N, 10 * rank + i).astype(np.uint8) for i in range(8)]
reqs += [comm.Isend(s, peer, 3) for s in send]
MPI.Request.Waitall(reqs)
out["exchange"] = all(bool((r == data(N, 10 * peer + i)).all()) for i, r in enumerate(recv))

# 4. Too long for the posting: an error, nothing written; the next message is the next receive's.
if rank == 0:
    comm.Send(np.full(9000, 7, np.uint8), 1, 4)
    comm.Send(np.full(5000, 8, np.uint8), 1, 4)
else:
    short = np.full(8000, 255, np.uint8)
    req = comm.Irecv(short, 0, 4)
    try:
        req.Wait()
        out["truncated"] = False
    except kolo.ArgumentError as e:
        out["truncated"] = "ERR_TRUNCATE" in str(e)
    out["untouched"] = bool((short == 255).all())
    got = np.zeros(5000, np.uint8)
    comm.Irecv(got, 0, 4).Wait()
    out["next"] = bool((got == 8).all())
print(json.dumps(out), flush=True)
