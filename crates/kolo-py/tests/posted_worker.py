"""kolo.MPI's receives posted at Irecv, between two processes (see test_mpi_posted.py): run under
`kolo run -n 2`; prints each rank's findings as JSON."""

import json
import time

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

# 5. The requests of posted receives and of sends in place are MPI.Requests: Get_status, polled,
# completes a posted receive; Waitall takes them mixed with REQUEST_NULL and plain receives, with
# statuses or without.
if rank == 0:
    comm.Send(data(9000, 5).astype(np.uint8), 1, 5)
    comm.Send(np.full(100, 3, np.uint8), 1, 6)
    big = data(N, 6).astype(np.uint8)
    req = comm.Isend(big, 1, 7)  # in place: pending until rank 1 has copied it
    out["send_request"] = isinstance(req, MPI.Request) and bool(req)
    MPI.Request.Waitall([req, MPI.REQUEST_NULL])
    out["send_done"] = not req and req == MPI.REQUEST_NULL
    comm.Send(data(9000, 8).astype(np.uint8), 1, 8)
    comm.Send(data(9000, 9).astype(np.uint8), 1, 8)
else:
    a, small, b = np.zeros(9000, np.uint8), np.zeros(100, np.uint8), np.zeros(N, np.uint8)
    ra, st = comm.Irecv(a, 0, 5), MPI.Status()
    until = time.monotonic() + 30
    while not ra.Get_status(st) and time.monotonic() < until:
        pass
    out["get_status"] = st.Get_count() == 9000 and bool((a == data(9000, 5)).all())
    rb = comm.Irecv(b, 0, 7)  # posted
    rs = comm.Irecv(small, 0, 6)  # plain (a short message)
    out["recv_request"] = isinstance(rb, MPI.Request) and bool(rb)
    MPI.Request.Waitall([rb, MPI.REQUEST_NULL, rs])
    out["mixed"] = (bool((b == data(N, 6)).all()) and bool((small == 3).all())
                    and not rb and not rs and rb == MPI.REQUEST_NULL)
    c, d, sts = np.zeros(9000, np.uint8), np.zeros(9000, np.uint8), []
    MPI.Request.Waitall([comm.Irecv(c, 0, 8), comm.Irecv(d, 0, 8)], sts)
    out["statuses"] = ([s.Get_count() for s in sts] == [9000, 9000]
                       and bool((c == data(9000, 8)).all()) and bool((d == data(9000, 9)).all()))
print(json.dumps(out), flush=True)
