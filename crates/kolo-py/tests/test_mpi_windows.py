"""kolo.MPI's windows of ``Irecv``s (one source, one tag, posted in a row: osu_bw's pattern),
which ``Waitall`` receives in one call into the extension: each buffer gets its message in
posting order, the statuses their counts, the bytes past a message stay as they were, and a
failure in the middle leaves the requests exactly as waiting on each in turn would."""

import numpy as np
import pytest

from conftest import ok, run_ranks
from kolo import MPI
from kolo._mpi import request as request_mod


def world(n, fn):
    return ok(run_ranks(n, lambda c: fn(MPI.Wrap(c))))


@pytest.fixture
def windows(monkeypatch):
    """Counts the windows `Waitall` receives in one call."""
    seen = []
    real = request_mod._receive_window

    def counting(requests, statuses):
        seen.append(len(requests))
        return real(requests, statuses)

    monkeypatch.setattr(request_mod, "_receive_window", counting)
    return seen


def test_a_window_gets_every_message_in_order_with_its_status(windows):
    def body(comm):
        if comm.rank == 1:
            for i in range(16):
                comm.Send(np.full(1 + i % 3, i, np.int32), 0, 5)
            return None
        bufs = [np.full(4, -1, np.int32) for _ in range(16)]
        reqs = [comm.Irecv([b, MPI.INT], 1, 5) for b in bufs]
        statuses = []
        MPI.Request.Waitall(reqs, statuses)
        return ([b.tolist() for b in bufs], [s.Get_count(MPI.INT) for s in statuses],
                [s.Get_source() for s in statuses], [bool(r) for r in reqs])

    bufs, counts, sources, pending = world(2, body)[0]
    assert bufs == [[i] * (1 + i % 3) + [-1] * (3 - i % 3) for i in range(16)]
    assert counts == [1 + i % 3 for i in range(16)]
    assert sources == [1] * 16 and not any(pending)
    assert windows == [16]


def test_a_window_after_a_wildcard_waits_its_turn(windows):
    def body(comm):
        if comm.rank == 1:
            for i in range(4):
                comm.Send(np.full(1, i, np.int64), 0, 7)
            return None
        first = np.full(1, -1, np.int64)
        any_req = comm.Irecv(first, MPI.ANY_SOURCE, MPI.ANY_TAG)  # posted first: takes message 0
        bufs = [np.full(1, -1, np.int64) for _ in range(3)]
        reqs = [comm.Irecv(b, 1, 7) for b in bufs]
        MPI.Request.Waitall(reqs)  # not a window: the wildcard before it competes
        any_req.Wait()
        return int(first[0]), [int(b[0]) for b in bufs]

    assert world(2, body)[0] == (0, [1, 2, 3])
    assert windows == []


def test_a_failure_in_a_window_leaves_the_rest_to_wait_for(windows):
    def body(comm):
        if comm.rank == 1:
            for n in (1, 1, 3, 1, 1):  # the third is longer than its buffer
                comm.Send(np.full(n, n, np.int32), 0, 9)
            return None
        bufs = [np.full(2, -1, np.int32) for _ in range(5)]
        reqs = [comm.Irecv(b, 1, 9) for b in bufs]
        with pytest.raises(Exception) as err:
            MPI.Request.Waitall(reqs)
        state = [bool(r) for r in reqs]
        MPI.Request.Waitall(reqs[3:])  # the rest still receive, in order
        return str(err.value), state, [b.tolist() for b in bufs]

    error, pending, bufs = world(2, body)[0]
    assert "truncat" in error.lower() or "longer" in error.lower(), error
    assert pending == [False, False, False, True, True]
    assert bufs[:2] == [[1, -1], [1, -1]] and bufs[3:] == [[1, -1], [1, -1]]
    assert windows == [5, 2]


def test_a_buffer_refused_in_a_window_stops_it_there(windows):
    # The window's buffers are held before any is received: one that cannot be written (bytes)
    # fails its own request after the ones before it have their messages; the rest stay pending.
    def body(comm):
        if comm.rank == 1:
            for i in range(5):
                comm.Send(np.full(1, i, np.int32), 0, 9)
            return None
        bufs = [np.full(2, -1, np.int32) for _ in range(5)]
        bufs[2] = bytes(8)
        reqs = [comm.Irecv(b, 1, 9) for b in bufs]
        with pytest.raises(Exception) as err:
            MPI.Request.Waitall(reqs)
        state = [bool(r) for r in reqs]
        # The refused request's message was not taken: the pending requests, posted first, get
        # it and the next, a receive after them the last.
        fresh = np.full(2, -1, np.int32)
        comm.Recv(fresh, 1, 9)
        MPI.Request.Waitall(reqs[3:])
        return str(err.value), state, [bufs[i].tolist() for i in (0, 1, 3, 4)], fresh.tolist()

    error, pending, bufs, fresh = world(2, body)[0]
    assert "writ" in error.lower() or "read-only" in error.lower(), error
    assert pending == [False, False, False, True, True]
    assert bufs == [[0, -1], [1, -1], [2, -1], [3, -1]] and fresh == [4, -1]
    assert windows == [5]
