"""Every collective of kolo's Python communicator, on every element type and reduction, against
numpy references (ranks as threads of one process)."""

import numpy as np
import pytest

import kolo
from conftest import ok, run_ranks

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]
OPS = ["sum", "prod", "min", "max", "avg"]


def data(rank, n, dtype, salt=0):
    """Small values (1 to 3: products over 4 ranks stay exact in uint8 and float16) that depend on
    the position and differ between every two ranks (up to 4), so block placement and element
    order are checked, not only the arithmetic."""
    v = (np.arange(n) // (rank + 1) + rank + salt) % 3 + 1
    return v.astype(dtype)


def test_the_data_tells_ranks_and_positions_apart():
    for n in (5, 9, 37):
        arrays = [data(r, n, np.int64) for r in range(4)]
        for a in range(4):
            assert len(set(arrays[a].tolist())) > 1, "position-dependent"
            for b in range(a):
                assert not np.array_equal(arrays[a], arrays[b]), (a, b, n)


def reference(arrays, op, dtype):
    stack = np.stack([a.astype(np.float64) for a in arrays])
    out = {
        "sum": stack.sum(0),
        "prod": stack.prod(0),
        "min": stack.min(0),
        "max": stack.max(0),
        "avg": stack.sum(0) / len(arrays),
    }[op]
    if np.issubdtype(dtype, np.integer):
        out = np.trunc(out)  # integer averages truncate
    return out.astype(dtype)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_all_reduce(size, dtype, op):
    n = 37
    res = ok(run_ranks(size, lambda c: c.all_reduce(data(c.rank, n, dtype), op)))
    want = reference([data(r, n, dtype) for r in range(size)], op, dtype)
    for got in res:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("op", OPS)
def test_reduce(size, op):
    n, root = 11, size - 1
    res = ok(run_ranks(size, lambda c: c.reduce(data(c.rank, n, np.float32), root, op)))
    want = reference([data(r, n, np.float32) for r in range(size)], op, np.float32)
    np.testing.assert_array_equal(res[root], want)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_and_all_gather(size, dtype):
    def body(c):
        b = data(c.rank, 9, dtype)
        c.broadcast(b, root=size - 1)
        g = c.all_gather(data(c.rank, 5, dtype))
        return b, g

    for b, g in ok(run_ranks(size, body)):
        np.testing.assert_array_equal(b, data(size - 1, 9, dtype))
        np.testing.assert_array_equal(g, np.stack([data(r, 5, dtype) for r in range(size)]))


def test_bfloat16_through_int16_view():
    import struct

    def bf16(x):  # float32 -> bfloat16 bits (exact for these small integers)
        return np.array([struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in x], np.uint16)

    def body(c):
        buf = bf16([c.rank + 1.0, 2.0, 3.0])
        c._c.all_reduce(buf, "sum", dtype="bfloat16")
        return buf

    for got in ok(run_ranks(3, body)):
        np.testing.assert_array_equal(got, bf16([6.0, 6.0, 9.0]))


@pytest.mark.parametrize("size", [2, 3, 4])
def test_reduce_scatter_gather_scatter_all_to_all(size):
    n = 4

    def body(c):
        rs = np.empty(n, np.float64)
        c.reduce_scatter(data(c.rank, n * size, np.float64), rs, "sum")
        g = c.gather(data(c.rank, n, np.int32), root=0)
        sc = np.empty(n, np.int64)
        full = np.arange(n * size, dtype=np.int64) if c.rank == 1 else None
        c.scatter(full, sc, root=1)
        a2a = np.empty(n * size, np.float32)
        send = np.arange(n * size, dtype=np.float32) + 100 * c.rank
        c.all_to_all(send, a2a)
        return rs, g, sc, a2a

    res = ok(run_ranks(size, body))
    total = sum(data(r, n * size, np.float64) for r in range(size))
    for r, (rs, g, sc, a2a) in enumerate(res):
        np.testing.assert_array_equal(rs, total[r * n : (r + 1) * n])
        if r == 0:
            np.testing.assert_array_equal(g, np.stack([data(q, n, np.int32) for q in range(size)]))
        else:
            assert g is None
        np.testing.assert_array_equal(sc, np.arange(r * n, (r + 1) * n))
        want = np.concatenate([np.arange(r * n, (r + 1) * n) + 100 * q for q in range(size)])
        np.testing.assert_array_equal(a2a, want.astype(np.float32))


def test_v_forms():
    size, counts = 3, [1, 3, 2]

    def body(c):
        mine = np.full(counts[c.rank], c.rank, np.float32)
        agv = np.empty(sum(counts), np.float32)
        c.all_gather_v(mine, agv, counts)
        gv = np.empty(sum(counts), np.float32) if c.rank == 2 else None
        c.gather(mine, gv, root=2, counts=counts)
        sv = np.empty(counts[c.rank], np.float32)
        c.scatter(np.arange(6, dtype=np.float32) if c.rank == 0 else None, sv, root=0, counts=counts)
        return agv, gv, sv

    res = ok(run_ranks(size, body))
    want = np.concatenate([np.full(n, r, np.float32) for r, n in enumerate(counts)])
    for r, (agv, gv, sv) in enumerate(res):
        np.testing.assert_array_equal(agv, want)
        if r == 2:
            np.testing.assert_array_equal(gv, want)
        start = sum(counts[:r])
        np.testing.assert_array_equal(sv, np.arange(start, start + counts[r]))


@pytest.mark.parametrize("dtype", [np.int16, np.int8, np.bool_, np.complex64, np.uint64])
def test_calls_that_move_data_take_any_dtype(dtype):
    # Moved as bytes, as mpi4py moves any buffer; counts stay in elements of the array.
    size, counts = 3, [1, 3, 2]

    def val(rank, n):
        return (np.arange(n) * 3 + rank + 1).astype(dtype)

    def body(c):
        r = c.rank
        b = val(0, 5) if r == 0 else np.zeros(5, dtype)
        c.broadcast(b, root=0)
        ag = c.all_gather(val(r, 2))
        agv = np.zeros(sum(counts), dtype)
        c.all_gather_v(val(r, counts[r]), agv, counts)
        gv = np.zeros(sum(counts), dtype) if r == 1 else None
        c.gather(val(r, counts[r]), gv, root=1, counts=counts)
        sv = np.zeros(counts[r], dtype)
        c.scatter(val(9, 6) if r == 0 else None, sv, root=0, counts=counts)
        a2a = np.zeros(size * 2, dtype)
        c.all_to_all(val(r, size * 2), a2a)
        p2p = np.zeros(4, dtype)
        c.send(val(r, 4), (r + 1) % size)
        c.recv(p2p, (r - 1) % size)
        return b, ag, agv, gv, sv, a2a, p2p

    res = ok(run_ranks(size, body))
    cat = np.concatenate([val(q, n) for q, n in enumerate(counts)])
    for r, (b, ag, agv, gv, sv, a2a, p2p) in enumerate(res):
        assert b.dtype == dtype and ag.dtype == dtype
        np.testing.assert_array_equal(b, val(0, 5))
        np.testing.assert_array_equal(ag, np.stack([val(q, 2) for q in range(size)]))
        np.testing.assert_array_equal(agv, cat)
        if r == 1:
            np.testing.assert_array_equal(gv, cat)
        start = sum(counts[:r])
        np.testing.assert_array_equal(sv, val(9, 6)[start : start + counts[r]])
        want = np.concatenate([val(q, size * 2)[2 * r : 2 * r + 2] for q in range(size)])
        np.testing.assert_array_equal(a2a, want)
        np.testing.assert_array_equal(p2p, val((r - 1) % size, 4))


def test_reductions_still_refuse_a_dtype_kolo_does_not_reduce():
    (c,) = kolo.local_world(1)
    with pytest.raises(TypeError, match=r"unsupported element type int16 \(numpy\): kolo reduces"):
        c.all_reduce(np.ones(2, np.int16))


def test_in_place_all_gather_from_own_slot():
    # The input is this rank's slot of the output (torch's all_gather_into_tensor idiom).
    def body(c):
        out = np.zeros((c.size, 3), np.float32)
        out[c.rank] = c.rank + 1
        c.all_gather(out[c.rank], out)
        return out

    for got in ok(run_ranks(3, body)):
        np.testing.assert_array_equal(got, np.repeat([[1], [2], [3]], 3, axis=1))


def test_point_to_point_and_objects():
    def body(c):
        if c.rank == 0:
            c.send(np.arange(4, dtype=np.int64), 1, tag=7)
            c.send_object({"x": [1, 2]}, 1)
            return None
        buf = np.empty(4, np.int64)
        c.recv(buf, 0, tag=7)
        return buf, c.recv_object(0)

    res = ok(run_ranks(2, body))
    np.testing.assert_array_equal(res[1][0], np.arange(4))
    assert res[1][1] == {"x": [1, 2]}


def test_object_collectives():
    def body(c):
        return (
            c.broadcast_object({"root": c.rank} if c.rank == 1 else None, root=1),
            c.all_gather_object(("r", c.rank)),
            c.gather_object(c.rank * 10, root=2),
            c.scatter_object([f"to {r}" for r in range(c.size)] if c.rank == 0 else None),
        )

    for r, (b, ag, g, s) in enumerate(ok(run_ranks(3, body))):
        assert b == {"root": 1}
        assert ag == [("r", 0), ("r", 1), ("r", 2)]
        assert g == ([0, 10, 20] if r == 2 else None)
        assert s == f"to {r}"


def test_async_work_and_order():
    def body(c):
        a = np.full(1000, c.rank, np.float32)
        b = np.full(10, c.rank + 1, np.int32)
        wa = c.all_reduce(a, async_op=True)
        wb = c.all_reduce(b, "max", async_op=True)
        return wa.wait(), wb.wait(), wa.is_completed()

    for a, b, done in ok(run_ranks(2, body)):
        assert done
        np.testing.assert_array_equal(a, np.full(1000, 1, np.float32))
        np.testing.assert_array_equal(b, np.full(10, 2, np.int32))


def test_split_and_new_group():
    def body(c):
        sub = c.split(c.rank % 2, key=-c.rank)
        x = sub.all_reduce(np.array([c.rank], np.int64))
        g = c.new_group([3, 1])
        y = None if g is None else g.all_gather(np.array([c.rank], np.int32)).ravel().tolist()
        return sub.rank, sub.size, int(x[0]), y

    res = ok(run_ranks(4, body))
    assert [r[3] for r in res] == [None, [3, 1], None, [3, 1]]
    assert [r[2] for r in res] == [2, 4, 2, 4]
    assert [r[0] for r in res] == [1, 1, 0, 0]  # ordered by key = -rank


def test_barrier_and_monitored_barrier():
    ok(run_ranks(3, lambda c: (c.barrier(), c.monitored_barrier(5.0))))


def test_mpi_names():
    from kolo import MPI

    def body(c):
        comm = MPI.Wrap(c)
        total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
        biggest = comm.allreduce(comm.Get_rank(), op=MPI.MAX)
        part = comm.scatter([[i] for i in range(comm.Get_size())] if comm.rank == 0 else None)
        arr = np.full(3, comm.rank, np.float64)
        comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM)
        out = np.empty(3, np.float64)
        comm.Allreduce(np.ones(3), out, op=MPI.SUM)
        red = np.empty(2, np.int64)
        comm.Reduce(np.full(2, comm.rank, np.int64), red, op=MPI.MAX, root=0)
        return total, biggest, part, arr.tolist(), out.tolist(), red.tolist(), comm.alltoall(
            [(comm.rank, j) for j in range(comm.size)]
        )

    res = ok(run_ranks(3, body))
    for r, (total, biggest, part, arr, out, red, a2a) in enumerate(res):
        assert (total, biggest, part) == (6, 2, [r])
        assert arr == [3.0] * 3 and out == [3.0] * 3
        if r == 0:
            assert red == [2, 2]
        assert a2a == [(q, r) for q in range(3)]
