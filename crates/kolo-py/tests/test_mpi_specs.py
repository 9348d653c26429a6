"""kolo.MPI's buffer specifications mean what they mean in mpi4py: only `count` elements are
sent, received or reduced, and the rest of every buffer stays as it was."""

import mmap

import numpy as np
import pytest

from conftest import ok, run_ranks
from kolo import MPI


def world(n, fn):
    """`fn(comm)` on every rank of a world of `n` threads, `comm` with mpi4py's names."""
    return ok(run_ranks(n, lambda c: fn(MPI.Wrap(c))))


def test_send_recv_count_leaves_the_rest():
    def body(comm):
        if comm.rank == 0:
            buf = np.arange(8, dtype=np.uint8)
            comm.Send([buf, 3, MPI.BYTE], 1, 5)
            comm.Send((np.arange(5, dtype=np.float64), 2, MPI.DOUBLE), 1, 6)
            comm.Send([np.arange(6, dtype=np.int32), (2, 3), MPI.INT], 1, 7)  # 2 from element 3
            return None
        got = np.full(8, 99, np.uint8)
        comm.Recv([got, 3, MPI.BYTE], 0, 5)
        dbl = np.full(4, -1.0)
        comm.Recv([dbl, 2, MPI.DOUBLE], 0, 6)
        ints = np.full(5, -1, np.int32)
        comm.Recv([ints, (2, 1), MPI.INT], 0, 7)  # into elements 1 and 2
        return got.tolist(), dbl.tolist(), ints.tolist()

    got, dbl, ints = world(2, body)[1]
    assert got == [0, 1, 2, 99, 99, 99, 99, 99]
    assert dbl == [0.0, 1.0, -1.0, -1.0]
    assert ints == [-1, 3, 4, -1, -1]


def test_recv_of_a_shorter_message_fills_the_start_and_status_counts_it():
    def body(comm):
        if comm.rank == 0:
            comm.Send([np.arange(3, dtype=np.uint8), MPI.BYTE], 1, 1)
            comm.Send(np.arange(2, dtype=np.float64), 1, 2)
            return None
        buf, st = bytearray(b"\xff" * 8), MPI.Status()
        comm.Recv(buf, 0, 1, st)
        dbl, st2 = np.zeros(4), MPI.Status()
        comm.Recv([dbl, MPI.DOUBLE], 0, 2, st2)
        return (bytes(buf), st.Get_source(), st.Get_tag(), st.Get_count(), st.Get_count(MPI.INT),
                dbl.tolist(), st2.Get_count(MPI.DOUBLE))

    got, source, tag, count, ints, dbl, dcount = world(2, body)[1]
    assert got == b"\x00\x01\x02" + b"\xff" * 5
    assert (source, tag, count, ints) == (0, 1, 3, MPI.UNDEFINED)
    assert dbl == [0.0, 1.0, 0.0, 0.0] and dcount == 2


def test_recv_of_a_longer_message_raises_truncate():
    def body(comm):
        if comm.rank == 0:
            comm.Send(bytearray(16), 1, 3)
            return None
        with pytest.raises(ValueError, match="ERR_TRUNCATE"):
            comm.Recv([bytearray(16), 8, MPI.BYTE], 0, 3)
        return True

    # Bad input ends the communicator (as kolo's methods do): rank 0 may see that afterwards.
    res = run_ranks(2, lambda c: body(MPI.Wrap(c)))
    assert res[1] is True


def test_a_count_past_the_buffer_raises():
    def body(comm):
        with pytest.raises(ValueError, match="do not fit"):
            comm.Send([bytearray(4), 5, MPI.BYTE], 0, 0)
        return True

    assert world(1, body) == [True]


def test_send_and_recv_read_every_form_the_same_way_natively_or_not():
    """Send and Recv read [buf, count, datatype] and a buffer alone natively, the rest in Python:
    both give the same bytes, statuses and errors, and nothing else is taken for a datatype."""

    def body(comm):
        if comm.rank == 0:
            comm.Send((np.arange(6, dtype=np.int16), 4, MPI.SHORT), 1, 1)  # a tuple: 8 bytes
            comm.Send([np.arange(4, dtype=np.uint8), 0, MPI.BYTE], 1, 2)  # nothing
            comm.Send(np.arange(3, dtype=np.float32), 1.0, 3)  # a buffer alone, a whole float
            comm.Send([np.arange(2, dtype=np.int64), 2, MPI.INT64_T], MPI.PROC_NULL, 4)
            comm.Send((np.arange(2, dtype=np.float64), MPI.DOUBLE), 1, 6)  # the whole buffer
            return None
        shorts, st = np.full(6, -1, np.int16), MPI.Status()
        comm.Recv([shorts, 6, MPI.SHORT], 0, 1, st)
        none, st0 = np.full(4, 7, np.uint8), MPI.Status()
        comm.Recv((none, 4, MPI.BYTE), 0, 2, st0)
        floats, st3 = np.zeros(4, np.float32), MPI.Status()
        comm.Recv([floats, 4, MPI.FLOAT], 0.0, 3.0, st3)
        doubles, st6 = np.full(3, -1.0), MPI.Status()
        comm.Recv([doubles, MPI.DOUBLE], 0, 6, st6)
        return (shorts.tolist(), (st.Get_source(), st.Get_tag(), st.Get_count(MPI.SHORT)),
                none.tolist(), st0.Get_count(), floats.tolist(), (st3.Get_source(), st3.Get_tag()),
                doubles.tolist(), st6.Get_count(MPI.DOUBLE))

    shorts, status, none, count0, floats, source_tag, doubles, count6 = world(2, body)[1]
    assert doubles == [0.0, 1.0, -1.0] and count6 == 2
    assert shorts == [0, 1, 2, 3, -1, -1] and status == (0, 1, 4)
    assert none == [7, 7, 7, 7] and count0 == 0
    assert floats == [0.0, 1.0, 2.0, 0.0]
    assert source_tag == (0, 3) and all(type(v) is int for v in source_tag)

    # Bad input (it ends the communicator), one world each: an object with a size is not a
    # datatype (the Python path names it); a read-only buffer cannot receive.
    def not_a_datatype(comm):
        with pytest.raises(TypeError, match="datatype"):
            comm.Send([bytearray(8), 2, np.zeros(3)], 0, 5)
        return True

    def read_only(comm):
        with pytest.raises(ValueError, match="read-only"):
            comm.Recv([bytes(4), 4, MPI.BYTE], 0, 3)
        return True

    def float_count(comm):  # a whole float is a rank or a tag, never a count
        with pytest.raises(TypeError, match="count must be an int, got float"):
            comm.Send([bytearray(8), 2.0, MPI.BYTE], 0, 5)
        return True

    assert world(1, not_a_datatype) == [True] and world(1, read_only) == [True]
    assert world(1, float_count) == [True]


def test_bcast_moves_count_elements_and_a_zero_dimensional_array():
    def body(comm):
        buf = np.arange(8, dtype=np.uint8) if comm.rank == 0 else np.full(8, 99, np.uint8)
        comm.Bcast([buf, 3, MPI.BYTE], root=0)
        n = np.array(41 if comm.rank == 0 else 0, dtype=int)  # mpi4py's compute-pi demo
        comm.Bcast([n, MPI.INT], root=0)
        return buf.tolist(), int(n)

    for buf, n in world(3, body)[1:]:
        assert buf == [0, 1, 2, 99, 99, 99, 99, 99] and n == 41


def test_reductions_reduce_count_elements():
    def body(comm):
        r = comm.rank + 1
        send = np.full(4, float(r))
        out = np.full(4, -1.0)
        comm.Allreduce([send, 2, MPI.DOUBLE], [out, 2, MPI.DOUBLE], op=MPI.SUM)
        inplace = np.full(4, float(r))
        comm.Allreduce(MPI.IN_PLACE, [inplace, 3, MPI.DOUBLE], op=MPI.MAX)
        red = np.full(3, -7, np.int64)
        mine = np.full(3, r, np.int64)
        comm.Reduce([mine, 2, MPI.LONG], [red, 2, MPI.LONG], op=MPI.SUM, root=1)
        return out.tolist(), inplace.tolist(), red.tolist(), mine.tolist()

    res = world(3, body)
    for rank, (out, inplace, red, mine) in enumerate(res):
        assert out == [6.0, 6.0, -1.0, -1.0]
        assert inplace == [3.0, 3.0, 3.0, float(rank + 1)]
        assert mine == [rank + 1] * 3  # a send buffer stays as it was, on every rank
        assert red == ([6, 6, -7] if rank == 1 else [-7, -7, -7])


def test_reductions_check_their_datatypes():
    def body(comm):
        with pytest.raises(ValueError, match="mismatch"):
            comm.Allreduce([np.zeros(2, np.int32), MPI.INT], [np.zeros(2), MPI.DOUBLE])
        return True

    assert world(1, body) == [True]


def test_gather_scatter_allgather_alltoall_move_count_per_rank():
    def body(comm):
        n, r = comm.size, comm.rank
        mine = np.full(4, 10 + r, np.uint8)
        g = np.full(3 * n + 2, 99, np.uint8)
        comm.Gather([mine, 3, MPI.BYTE], [g, 3, MPI.BYTE], root=0)
        a = np.full(2 * n + 1, 99, np.uint8)
        comm.Allgather([mine, 2, MPI.BYTE], [a, 2, MPI.BYTE])
        src = np.arange(2 * n + 3, dtype=np.uint8)
        s = np.full(4, 99, np.uint8)
        comm.Scatter([src, 2, MPI.BYTE] if r == 0 else None, [s, 2, MPI.BYTE], root=0)
        t_send = np.array([10 * r + j for j in range(n) for _ in range(2)] + [7], np.uint8)
        t = np.full(2 * n + 2, 99, np.uint8)
        comm.Alltoall([t_send, 2, MPI.BYTE], [t, 2, MPI.BYTE])
        return g.tolist(), a.tolist(), s.tolist(), t.tolist()

    n = 3
    res = world(n, body)
    for r, (g, a, s, t) in enumerate(res):
        if r == 0:
            assert g == [v for q in range(n) for v in [10 + q] * 3] + [99, 99]
        else:
            assert g == [99] * (3 * n + 2)
        assert a == [v for q in range(n) for v in [10 + q] * 2] + [99]
        assert s == [2 * r, 2 * r + 1, 99, 99]
        assert t == [10 * q + r for q in range(n) for _ in range(2)] + [99, 99]


def test_vector_counts_and_displacements_are_checked():
    """A vector message's counts and displacements: any sequence of ints (numpy's too); a
    negative one or one that is not an int is named."""

    def good(comm):
        send = np.arange(6, dtype=np.int32)
        got = np.full(8, -1, np.int32)
        comm.Alltoallv([send, (np.array([3]), [2]), MPI.INT], [got, ([3], np.array([5])), MPI.INT])
        return got.tolist()

    assert world(1, good) == [[-1, -1, -1, -1, -1, 2, 3, 4]]

    def bad(counts, displs, error, match):
        def body(comm):
            with pytest.raises(error, match=match):
                comm.Alltoallv([bytearray(8), (counts, displs), MPI.BYTE], [bytearray(8), 4, MPI.BYTE])
            return True

        assert world(1, body) == [True]

    bad([-1], [0], ValueError, "negative count -1")
    bad([2.5], [0], TypeError, "count must be an int, got float")
    bad([2], [-3], ValueError, "negative displacement -3")
    bad([2], ["0"], TypeError, "displacement must be an int, got str")


def test_in_place_forms_of_gather_scatter_allgather():
    def body(comm):
        n, r = comm.size, comm.rank
        ag = np.full(2 * n + 1, 99, np.uint8)
        ag[2 * r:2 * r + 2] = 20 + r
        comm.Allgather(MPI.IN_PLACE, [ag, 2, MPI.BYTE])
        if r == 0:
            g = np.full(2 * n + 1, 99, np.uint8)
            g[0:2] = 30
            comm.Gather(MPI.IN_PLACE, [g, 2, MPI.BYTE], root=0)
            src = np.arange(2 * n + 1, dtype=np.uint8)
            comm.Scatter([src, 2, MPI.BYTE], MPI.IN_PLACE, root=0)
            return ag.tolist(), g.tolist(), src.tolist()
        comm.Gather([np.full(2, 30 + r, np.uint8), MPI.BYTE], None, root=0)
        s = np.full(3, 99, np.uint8)
        comm.Scatter(None, [s, 2, MPI.BYTE], root=0)
        return ag.tolist(), None, s.tolist()

    n = 3
    res = world(n, body)
    for r, (ag, g, s) in enumerate(res):
        assert ag == [v for q in range(n) for v in [20 + q] * 2] + [99]
        if r == 0:
            assert g == [v for q in range(n) for v in [30 + q] * 2] + [99]
            assert s == list(range(2 * n + 1))  # the root's send buffer is left as it was
        else:
            assert s == [2 * r, 2 * r + 1, 99]


def test_mmap_buffers_as_the_osu_programs_allocate_them():
    def body(comm):
        buf = mmap.mmap(-1, 64)  # zeros
        if comm.rank == 0:
            buf[:4] = b"abcd"
            comm.Send([buf, 4, MPI.BYTE], 1, 1)
            comm.Bcast([buf, 0, MPI.BYTE], 0)  # an empty message: nothing changes
            return None
        buf[:] = b"\xff" * 64
        comm.Recv([buf, 4, MPI.BYTE], 0, 1)
        comm.Bcast([buf, 0, MPI.BYTE], 0)
        return bytes(buf[:6])

    assert world(2, body)[1] == b"abcd\xff\xff"
