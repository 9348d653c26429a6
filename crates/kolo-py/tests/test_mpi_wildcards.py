"""kolo.MPI's receives from any source and with any tag (``MPI.ANY_SOURCE``, ``MPI.ANY_TAG``,
mpi4py's defaults): what they match, the status they fill, the bytes past the message left as
they were, and MPI's matching order between posted receives with and without wildcards."""

import numpy as np
import pytest

from conftest import ok, run_ranks
from kolo import MPI


def world(n, fn):
    return ok(run_ranks(n, lambda c: fn(MPI.Wrap(c))))


def test_recv_any_source_any_tag_fills_the_status():
    def body(comm):
        r = comm.rank
        if r != 0:
            comm.Send(np.full(r, r, np.int32), 0, tag=10 * r)
            comm.Barrier()  # the objects after rank 0's buffer receives (any tag takes them too)
            comm.send({"from": r}, 0, tag=20 + r)
            return None
        got = []
        for _ in range(2):
            buf, st = np.full(4, -1, np.int32), MPI.Status()
            comm.Recv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
            got.append((st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT), buf.tolist()))
        comm.Barrier()
        objs = []
        for _ in range(2):
            st = MPI.Status()
            obj = comm.recv(status=st)  # mpi4py's defaults: any source, any tag
            objs.append((st.source, st.tag, obj))
        return sorted(got), sorted(objs, key=lambda o: o[0])

    got, objs = world(3, body)[0]
    assert got == [(1, 10, 1, [1, -1, -1, -1]), (2, 20, 2, [2, 2, -1, -1])]
    assert objs == [(1, 21, {"from": 1}), (2, 22, {"from": 2})]


def test_any_tag_from_one_source_takes_its_messages_in_order():
    def body(comm):
        if comm.rank == 1:
            for i, tag in enumerate([7, 3, 9]):
                comm.Send(np.full(2, i, np.int64), 0, tag)
            return None
        out = []
        for _ in range(3):
            buf, st = np.zeros(2, np.int64), MPI.Status()
            comm.Recv(buf, source=1, status=st)  # tag: mpi4py's default, ANY_TAG
            out.append((int(buf[0]), st.Get_tag()))
        return out

    assert world(2, body)[0] == [(0, 7), (1, 3), (2, 9)]


def test_posted_receives_match_in_posting_order_with_wildcards():
    def body(comm):
        if comm.rank == 1:
            for v, tag in [(1, 5), (2, 6), (3, 5), (4, 6)]:
                comm.Send(np.array([v], np.int32), 0, tag)
            comm.send("last", 0, tag=8)
            return None
        bufs = [np.zeros(1, np.int32) for _ in range(4)]
        reqs = [comm.Irecv(bufs[0], 1, 5), comm.Irecv(bufs[1], MPI.ANY_SOURCE, MPI.ANY_TAG),
                comm.Irecv(bufs[2], 1, 6), comm.Irecv(bufs[3], 1, 5)]
        obj = comm.irecv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        statuses = [MPI.Status() for _ in reqs]
        # Waited on last first: the receives posted before each that could take its message
        # take theirs first, as MPI matches them.
        for i in (3, 2, 1, 0):
            reqs[i].Wait(statuses[i])
        st = MPI.Status()
        last = obj.wait(st)
        return ([int(b[0]) for b in bufs], [(s.source, s.tag) for s in statuses],
                (last, st.source, st.tag))

    values, statuses, last = world(2, body)[0]
    assert values == [1, 2, 4, 3]
    assert statuses == [(1, 5), (1, 6), (1, 6), (1, 5)]
    assert last == ("last", 1, 8)


def test_test_and_bad_wildcards():
    def body(comm):
        if comm.rank == 0:
            req = comm.Irecv(np.zeros(1, np.int32), MPI.ANY_SOURCE, MPI.ANY_TAG)
            early = req.Test()  # rank 1 sends only after the barrier: nothing there yet
            comm.Barrier()
            while not req.Test():
                pass
            with pytest.raises(ValueError, match="source"):
                comm.Recv(np.zeros(1), source=-7)
            with pytest.raises(ValueError, match="tag"):
                comm.Recv(np.zeros(1), source=1, tag=-5)
            with pytest.raises(TypeError, match="source"):
                comm.Irecv(np.zeros(1), source=[1])
            return early
        comm.Barrier()
        comm.Send(np.ones(1, np.int32), 0, 4)
        return None

    assert world(2, body)[0] is False
