"""kolo.MPI's mpi4py API beyond the basic collectives: timers, the processor name, Sendrecv,
Isend/Irecv with requests and statuses, the vector collectives, and NotImplementedError for what
kolo does not do."""

import socket
import time

import numpy as np
import pytest

from conftest import ok, run_ranks
from kolo import MPI


def world(n, fn):
    return ok(run_ranks(n, lambda c: fn(MPI.Wrap(c))))


def test_wtime_wtick_processor_name():
    t0 = MPI.Wtime()
    time.sleep(0.01)
    dt = MPI.Wtime() - t0
    assert 0.009 < dt < 1.0
    assert 0 < MPI.Wtick() <= 1e-6
    assert MPI.Get_processor_name() == socket.gethostname()
    assert MPI.Is_initialized() and not MPI.Is_finalized()


def test_sendrecv_exchanges_around_a_ring():
    def body(comm):
        n, r = comm.size, comm.rank
        right, left = (r + 1) % n, (r - 1) % n
        got, st = np.full(3, -1, np.int64), MPI.Status()
        comm.Sendrecv(np.full(2, r, np.int64), right, 4, [got, 2, MPI.LONG], left, 4, st)
        obj = comm.sendrecv({"from": r}, dest=right, sendtag=9, source=left, recvtag=9)
        rep = np.full(2, r, np.int32)
        comm.Sendrecv_replace(rep, right, 1, left, 1)
        return got.tolist(), st.Get_source(), st.Get_count(MPI.LONG), obj, rep.tolist()

    for r, (got, source, count, obj, rep) in enumerate(world(3, body)):
        left = (r - 1) % 3
        assert got == [left, left, -1] and (source, count) == (left, 2)
        assert obj == {"from": left} and rep == [left, left]


def test_isend_irecv_waitall_in_posting_order():
    def body(comm):
        if comm.rank == 0:
            reqs = [comm.Isend(np.full(2, i, np.int32), 1, 7) for i in range(4)]
            reqs.append(comm.isend("hello", 1, 8))
            MPI.Request.Waitall(reqs)
            return [bool(r) for r in reqs]
        bufs = [np.full(3, -1, np.int32) for _ in range(4)]
        reqs = [comm.Irecv([b, 2, MPI.INT], 0, 7) for b in bufs]
        obj_req = comm.irecv(source=0, tag=8)
        statuses = []
        # Waited on out of order, the receives still take the messages in posting order.
        reqs[2].Wait()
        MPI.Request.Waitall(reqs, statuses)
        return ([b.tolist() for b in bufs], [s.Get_count(MPI.INT) for s in statuses],
                obj_req.wait(), reqs[0] == MPI.REQUEST_NULL)

    sent, (bufs, counts, obj, null) = world(2, body)
    assert sent == [False] * 5  # complete: each request is now REQUEST_NULL
    assert bufs == [[i, i, -1] for i in range(4)]
    assert counts == [2] * 4 and obj == "hello" and null


def test_test_waitany_and_status_of_a_request():
    def body(comm):
        if comm.rank == 0:
            comm.recv(source=1, tag=1)  # rank 1 tested before anything was sent
            comm.Send(bytearray(b"xyz"), 1, 2)
            comm.Send(bytearray(b"ab"), 1, 3)
            return None
        a, b = bytearray(4), bytearray(4)
        ra, rb = comm.Irecv(a, 0, 2), comm.Irecv(b, 0, 3)
        early = ra.Test()
        comm.send("go", 0, 1)
        st = MPI.Status()
        first = MPI.Request.Waitany([ra, rb], st)
        rest = MPI.Request.Waitany([ra, rb])
        done = MPI.Request.Waitany([ra, rb])  # none active
        return early, first, st.Get_tag(), rest, done, bytes(a), bytes(b)

    early, first, tag, rest, done, a, b = world(2, body)[1]
    assert early is False
    assert {first, rest} == {0, 1} and tag == (2 if first == 0 else 3)
    assert done == MPI.UNDEFINED
    assert (a, b) == (b"xyz\x00", b"ab\x00\x00")


def test_proc_null_is_a_no_op():
    def body(comm):
        st = MPI.Status()
        comm.Send(bytearray(4), MPI.PROC_NULL)
        comm.Recv(bytearray(4), MPI.PROC_NULL, 0, st)
        # A nonblocking receive from PROC_NULL is complete at once, with MPI's empty status.
        req = comm.Irecv(bytearray(4), MPI.PROC_NULL, 5)
        ist = MPI.Status()
        done = req.Test(ist)
        req.Wait(ist)
        return (st.Get_source(), st.Get_count(), done, ist.Get_source(), ist.Get_tag(),
                ist.Get_count(), req == MPI.REQUEST_NULL)

    assert world(1, body) == [(MPI.PROC_NULL, 0, True, MPI.PROC_NULL, MPI.ANY_TAG, 0, True)]


def test_vector_collectives_with_gaps_leave_them_alone():
    def body(comm):
        n, r = comm.size, comm.rank  # 3 ranks
        counts, displs = [1, 2, 3], [0, 2, 5]  # gaps at elements 1 and 4, tail at 8..9
        mine = np.full(counts[r], float(10 + r))
        gv = np.full(10, -1.0)
        comm.Gatherv([mine, MPI.DOUBLE], [gv, (counts, displs), MPI.DOUBLE] if r == 0 else None,
                     root=0)
        agv = np.full(10, -1.0)
        comm.Allgatherv([mine, MPI.DOUBLE], [agv, (counts, displs), MPI.DOUBLE])
        src = np.arange(10, dtype=np.float64)
        sv = np.full(4, -1.0)
        comm.Scatterv([src, (counts, displs), MPI.DOUBLE] if r == 0 else None,
                      [sv, counts[r], MPI.DOUBLE], root=0)
        # Alltoallv: counts[j] elements to rank j, packed in the send buffer; received at the
        # displacements with a gap after each block.
        send = np.array([100 * r + j for j in range(n) for _ in range(counts[j])], np.int32)
        rc = [counts[r]] * n
        rd = [i * (counts[r] + 1) for i in range(n)]
        recv = np.full(n * (counts[r] + 1), -1, np.int32)
        comm.Alltoallv([send, (counts, None), MPI.INT], [recv, (rc, rd), MPI.INT])
        return gv.tolist(), agv.tolist(), sv.tolist(), recv.tolist()

    packed = [10.0, -1.0, 11.0, 11.0, -1.0, 12.0, 12.0, 12.0, -1.0, -1.0]
    for r, (gv, agv, sv, recv) in enumerate(world(3, body)):
        assert gv == (packed if r == 0 else [-1.0] * 10)
        assert agv == packed
        start = [0, 2, 5][r]
        assert sv == [float(start + i) for i in range(r + 1)] + [-1.0] * (3 - r)
        c = r + 1
        assert recv == [v for q in range(3) for v in [100 * q + r] * c + [-1]]


def test_vector_collectives_packed_counts_and_in_place():
    def body(comm):
        n, r = comm.size, comm.rank  # 2 ranks
        counts = [2, 3]
        agv = np.zeros(5, np.uint8)
        agv[sum(counts[:r]):sum(counts[:r + 1])] = 50 + r
        comm.Allgatherv(MPI.IN_PLACE, [agv, counts, MPI.BYTE])
        out = np.full(6, 9, np.uint8)
        comm.Gatherv([np.full(counts[r], r, np.uint8), MPI.BYTE], [out, counts, MPI.BYTE], root=1)
        return agv.tolist(), out.tolist()

    res = world(2, body)
    for r, (agv, out) in enumerate(res):
        assert agv == [50, 50, 51, 51, 51]
        assert out == ([0, 0, 1, 1, 1, 9] if r == 1 else [9] * 6)


def test_what_kolo_lacks_raises_not_implemented_naming_it():
    def body(comm):
        with pytest.raises(NotImplementedError, match="MPI.Comm.Probe"):
            comm.Probe(0, 0)
        with pytest.raises(NotImplementedError, match="MPI.Win"):
            MPI.Win.Create(None, comm=comm)
        with pytest.raises(NotImplementedError, match="BAND"):
            comm.Allreduce(MPI.IN_PLACE, np.zeros(2, np.int32), op=MPI.BAND)
        assert not hasattr(MPI, "Win") and not hasattr(comm, "Spawn")
        comm.Barrier()  # NotImplementedError leaves the communicator working
        return comm.allreduce(1, op=MPI.SUM)

    assert world(2, body) == [2, 2]


def test_bad_input_fails_the_peers_naming_the_call_once():
    import kolo

    def body(c):
        comm = MPI.Wrap(c)
        try:
            if comm.Get_rank() == 0:  # 3 values are not 2 equal blocks
                comm.Scatter([np.zeros(3), MPI.DOUBLE], MPI.IN_PLACE, root=0)
            else:
                comm.Scatter(None, np.zeros(1), root=0)
        except (ValueError, kolo.KoloError) as e:
            return str(e)
        return None

    own, peer = run_ranks(2, body)
    assert own.startswith("message: cannot infer the count: 24 bytes are not 2"), own
    # The peer's error names rank 0 once and the MPI call (not "MPI Scatter on rank 0" again).
    assert peer.startswith("scatter on rank 1: aborted by rank 0: MPI Scatter: message:"), peer


def test_a_buffer_of_the_wrong_length_is_said_in_bytes():
    import kolo

    def body(c):
        comm = MPI.Wrap(c)
        r = comm.Get_rank()
        recv = np.empty(3, np.float64) if r == 0 else None  # 2 ranks x 2 values need 4
        try:
            comm.Gather(np.full(2, r, np.float64), recv, root=0)
        except kolo.KoloError as e:
            return e
        return None

    own, peer = run_ranks(2, body)
    assert isinstance(own, kolo.ArgumentError), own
    assert str(own).endswith("buffer `recv` has 24 bytes, expected 32"), own
    # The peer reads the same count in the abort it gets, not 24 "elements" of no datatype.
    assert isinstance(peer, kolo.KoloError), peer
    assert "has 24 bytes, expected 32" in str(peer), peer


def test_a_reductions_length_stays_in_elements():
    import kolo

    def body(c):
        comm = MPI.Wrap(c)
        try:  # 2 ranks x 2 doubles need 4 to send
            comm.Reduce_scatter_block(np.ones(3), np.empty(2), op=MPI.SUM)
        except kolo.ArgumentError as e:
            return str(e)
        return None

    for text in run_ranks(2, body):
        assert text.endswith("buffer `send` has 3 elements, expected 4"), text
