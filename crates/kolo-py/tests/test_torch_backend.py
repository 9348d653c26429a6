"""The torch backend's calls in one process (a rank per thread, kolo's local transport): receives
from any source, the coalesced all-gather's layout, every dtype through the calls that only move
data, the sparse all-reduce, monitored_barrier's messages and its timeout of 0, the group's CPU
backend, and the import order of kolo.torch and torch.distributed. Skipped without torch."""

import datetime
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

import kolo  # noqa: E402
from conftest import ok, run_ranks  # noqa: E402


def group(c):
    import kolo.torch as kt

    return kt.ProcessGroupKolo(c._c, c.rank, c.size)


def test_recv_from_any_source_names_the_sender():
    def body(c):
        pg = group(c)
        if c.rank != 0:
            pg.send([torch.full((3,), float(c.rank))], 0, 4).wait()
            pg.send([torch.full((3,), float(c.rank))], 0, 5).wait()
            return None
        senders = []
        for _ in range(c.size - 1):  # torch's irecv without a source
            buf = torch.empty(3)
            w = pg.recv_anysource([buf], 4)
            w.wait()
            assert buf.tolist() == [float(w._source_rank())] * 3
            senders.append(w.source_rank())
        for _ in range(c.size - 1):  # the native call, blocking: the sender returned
            buf = torch.empty(3)
            src = c._c.recv_any(buf.numpy(), 5)
            assert buf.tolist() == [float(src)] * 3
            senders.append(src)
        return senders

    senders = ok(run_ranks(3, body))[0]
    assert sorted(senders) == [1, 1, 2, 2]


def test_recv_work_knows_its_source_and_not_before():
    import kolo.torch as kt

    w = kt._Work([])  # a work that is not a receive's
    with pytest.raises(ValueError, match="source_rank"):
        w._source_rank()

    def body(c):
        pg = group(c)
        if c.rank == 1:
            pg.send([torch.tensor([7], dtype=torch.int8)], 0, 0).wait()
            return None
        buf = torch.empty(1, dtype=torch.int8)
        w = pg.recv([buf], 1, 0)
        w.wait()
        return w._source_rank(), buf.item()

    assert ok(run_ranks(2, body))[0] == (1, 7)


def test_recv_from_any_source_times_out_naming_rank_and_call():
    def body(c):
        if c.rank == 1:
            time.sleep(1.5)  # alive, silent
            return None
        t = time.monotonic()
        with pytest.raises(kolo.KoloTimeoutError) as e:
            c._c.recv_any(bytearray(4), 9)
        return str(e.value), time.monotonic() - t

    msg, waited = ok(run_ranks(2, body, comm_timeout=0.5))[0]
    # Torch's tests match a timed-out call's error against " (Timed out|closed|timeout) ".
    assert " timeout " in msg and "recv on rank 0" in msg and "any rank" in msg, msg
    assert 0.4 <= waited < 5, waited


def test_all_gather_coalesced_is_one_list_per_rank():
    def body(c):
        pg = group(c)
        ins = [torch.full((2,), float(c.rank)), torch.full((3,), 10 + c.rank, dtype=torch.int64)]
        outs = [[torch.empty(2), torch.empty(3, dtype=torch.int64)] for _ in range(c.size)]
        pg.allgather_coalesced(outs, ins).wait()
        return [[o[0].tolist(), o[1].tolist()] for o in outs]

    for got in ok(run_ranks(3, body)):
        assert got == [[[float(k)] * 2, [10 + k] * 3] for k in range(3)]

    def wrong(c):
        with pytest.raises(ValueError, match="one per rank"):
            group(c).allgather_coalesced([[torch.empty(2)]], [torch.zeros(2)])

    ok(run_ranks(2, wrong))


DTYPES = [torch.int8, torch.int16, torch.bool, torch.complex64, torch.complex128, torch.float16,
          torch.uint16]


def values(dtype, start, n):
    x = torch.arange(start, start + n)
    if dtype == torch.bool:
        return x % 2 == 1
    if dtype.is_complex:
        return torch.complex(x.double(), -x.double()).to(dtype)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_calls_that_move_data_take_every_dtype(dtype):
    from torch.distributed import AllToAllOptions, BroadcastOptions, GatherOptions, ScatterOptions

    def body(c):
        pg, r, n = group(c), c.rank, c.size
        x = values(dtype, 10 * r, 4)
        opts = BroadcastOptions()
        opts.rootRank = 1
        pg.broadcast([x], opts).wait()
        assert torch.equal(x, values(dtype, 10, 4)), x

        out = torch.empty(n * 4, dtype=dtype)
        pg.all_gather_single(out, values(dtype, 10 * r, 4)).wait()
        assert torch.equal(out, torch.cat([values(dtype, 10 * k, 4) for k in range(n)]))

        so = ScatterOptions()
        so.rootRank = 0
        got = torch.empty(2, dtype=dtype)
        parts = [[values(dtype, 100 + 2 * k, 2) for k in range(n)]] if r == 0 else []
        pg.scatter([got], parts, so).wait()
        assert torch.equal(got, values(dtype, 100 + 2 * r, 2))

        go = GatherOptions()
        go.rootRank = 0
        outs = [[torch.empty(2, dtype=dtype) for _ in range(n)]] if r == 0 else []
        pg.gather(outs, [values(dtype, 5 * r, 2)], go).wait()
        if r == 0:
            assert all(torch.equal(o, values(dtype, 5 * k, 2)) for k, o in enumerate(outs[0]))

        # Rank r sends k + 1 rows of two to rank k, and receives r + 1 rows from each rank.
        sends = [k + 1 for k in range(n)]
        recvs = [r + 1] * n
        inp = values(dtype, 1000 * r, 2 * sum(sends)).view(-1, 2)
        res = torch.empty(sum(recvs), 2, dtype=dtype)
        pg.all_to_all_single(res, inp, recvs, sends, AllToAllOptions()).wait()
        want = [values(dtype, 1000 * k, 2 * sum(sends)).view(-1, 2) for k in range(n)]
        at = sum(sends[:r])
        assert torch.equal(res, torch.cat([w[at : at + r + 1] for w in want]))

        peer = (r + 1) % n
        pg.send([values(dtype, r, 3)], peer, 1).wait()
        buf = torch.empty(3, dtype=dtype)
        pg.recv([buf], (r - 1) % n, 1).wait()
        assert torch.equal(buf, values(dtype, (r - 1) % n, 3))

    ok(run_ranks(3, body))


def test_sparse_all_reduce_sums_and_elsewhere_is_refused():
    def body(c):
        pg, r = group(c), c.rank
        idx = torch.tensor([[r, 2], [0, 1]])
        val = torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * (r + 1)
        t = torch.sparse_coo_tensor(idx, val, (3, 2, 2), check_invariants=True)
        dense = [torch.sparse_coo_tensor(torch.tensor([[k, 2], [0, 1]]),
                                         torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * (k + 1),
                                         (3, 2, 2), check_invariants=True).to_dense()
                 for k in range(c.size)]
        pg.allreduce([t]).wait()
        assert t.is_sparse and torch.equal(t.to_dense(), sum(dense))
        with pytest.raises(TypeError, match="sparse tensors are not supported"):
            pg.broadcast([t])

    ok(run_ranks(2, body))


def test_an_empty_all_reduce_is_refused_on_every_rank():
    def body(c):
        with pytest.raises(ValueError, match="non-empty tensor list"):
            group(c).allreduce([])
        # Bad input on one rank ends the group on every rank, naming it (no one waits).
        said = r"aborted(?: by rank \d)?: allreduce: kolo: allreduce requires"
        with pytest.raises(kolo.KoloError, match=said):
            group(c).allreduce([torch.ones(2)]).wait()

    ok(run_ranks(2, body))


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_the_roots_list_holds_one_tensor_per_rank_or_every_rank_fails(op):
    which = "output" if op == "gather" else "input"

    def body(c):
        g, x = group(c), torch.ones(2)
        three = [[torch.empty(2) for _ in range(3)]]
        if c.rank == 1:
            # The other rank's call fails at once, naming rank 0 and the list.
            with pytest.raises(kolo.KoloError, match=f"aborted by rank 0: {op}: kolo: {op}: the"):
                (g.gather([], [x]) if op == "gather" else g.scatter([x], [])).wait()
            return "failed"
        with pytest.raises(ValueError, match=f"{which} list holds 3 tensors; it should hold 2"):
            g.gather(three, [x]) if op == "gather" else g.scatter([x], three)
        return "refused"

    assert ok(run_ranks(2, body)) == ["refused", "failed"]


def test_a_list_tensor_of_another_dtype_or_length_is_refused():
    from kolo._torch_ops import one_per_rank

    like = torch.ones(2)
    with pytest.raises(ValueError, match=r"output\[1\] is torch.float64 x 2, the other side"):
        one_per_rank([like, like.double()], like, 2, "gather", "output")
    with pytest.raises(ValueError, match=r"input\[0\] is torch.float32 x 3"):
        one_per_rank([torch.ones(3), like], like, 2, "scatter", "input")
    one_per_rank([like, torch.empty(1, 2).t()], like, 2, "gather", "output")


def test_an_unsupported_reduction_is_named_as_torch_names_it():
    import torch.distributed as dist
    from kolo._torch_ops import op_name

    with pytest.raises(ValueError, match=r"unsupported reduction ReduceOp.PREMUL_SUM: "):
        op_name(dist._make_nccl_premul_sum(2.0))
    with pytest.raises(ValueError, match=r"unsupported reduction ReduceOp.BAND: "):
        op_name(dist.ReduceOp.BAND)


def barrier_errors(size, absent, timeout):
    """What each rank's monitored_barrier(timeout) raises when rank `absent` does not come."""

    def body(c):
        if c.rank == absent:
            time.sleep(0.5)
            return None
        with pytest.raises(kolo.KoloTimeoutError) as e:
            group(c).monitored_barrier(datetime.timedelta(seconds=timeout))
        return str(e.value)

    return ok(run_ranks(size, body))


def test_monitored_barrier_says_it_as_gloo_does():
    # Torch's tests match Gloo's wording.
    e = barrier_errors(3, 2, 0.3)
    assert "Rank 2 failed to pass monitoredBarrier in 300 ms" in e[0], e[0]
    assert ("Rank 1 successfully reached monitoredBarrier, but received errors while waiting "
            "for send/recv from rank 0: Rank 2 failed") in e[1], e[1]
    # A timeout of 0 passes only the ranks already there: rank 0 times out at once.
    e = barrier_errors(2, 1, 0)
    assert "Rank 0 timed out in monitoredBarrier after 0 ms" in e[0], e[0]


def run_python(code):
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "could not register" not in p.stderr, p.stderr
    return p.stdout


@pytest.mark.parametrize("first", ["kolo.torch", "torch.distributed"])
def test_import_order_does_not_matter(first):
    second = "torch.distributed" if first == "kolo.torch" else "kolo.torch"
    out = run_python(f"""
        import {first}
        import {second}
        import torch.distributed as dist
        print("kolo" in dist.Backend.backend_list)
    """)
    assert out.strip() == "True"


def test_the_group_has_a_cpu_backend():
    # torch 2.x looks the CPU backend up (batch_isend_irecv, monitored_barrier).
    out = run_python("""
        import datetime
        import torch, torch.distributed as dist
        dist.init_process_group("kolo", store=dist.HashStore(), rank=0, world_size=1)
        g = dist.group.WORLD
        print(g._device_types, g._get_backend(torch.device("cpu")).getBackendName())
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=5))
        x, y = torch.arange(4.0), torch.empty(4)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 0), dist.P2POp(dist.irecv, y, 0)])
        for r in reqs:
            r.wait()
        print(y.tolist())
        dist.destroy_process_group()
    """)
    assert "[device(type='cpu')] kolo" in out and "[0.0, 1.0, 2.0, 3.0]" in out, out


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32", "int64",
                                   "uint8"])
def test_a_synchronous_all_reduce_of_one_tensor_goes_by_its_address(dtype):
    # dist.all_reduce's path: one dense CPU tensor, asyncOp false: reduced through its address,
    # no work returned (torch waits on none); the CPU backend, torch's C++ side, gets a work.
    import torch.distributed as dist

    dt = getattr(torch, dtype)

    def body(c):
        pg = group(c)
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        x = torch.arange(7).to(dt) + c.rank
        tail = torch.full((3,), 9).to(dt)
        whole = torch.cat([x, tail])
        view = whole[:7]  # contiguous, at the start of a larger storage: the tail untouched
        assert pg.allreduce([view], opts) is None
        opts.reduceOp = dist.ReduceOp.MAX
        y = torch.arange(5).to(dt) * (c.rank + 1)
        assert pg.allreduce([y], opts) is None
        from kolo._torch_ops import CpuBackend
        w = CpuBackend(pg).allreduce([torch.ones(2, dtype=dt)], opts)
        assert w is not None and w.wait()
        return whole.tolist(), y.tolist()

    expect_x = [float(2 * i + 1) for i in range(7)] + [9.0] * 3
    for whole, y in ok(run_ranks(2, body)):
        assert [float(v) for v in whole] == expect_x, (dtype, whole)
        assert [float(v) for v in y] == [float(2 * i) for i in range(5)], (dtype, y)


def test_tensors_the_address_path_cannot_take_are_reduced_the_general_way():
    # Requiring grad, several of two types: the general path, the same sums.
    import torch.distributed as dist

    def body(c):
        pg = group(c)
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        leaf = torch.ones(3, requires_grad=True)
        pair = [torch.ones(2) * (c.rank + 1), torch.ones(1, dtype=torch.int64)]
        for ts in ([leaf], pair):
            w = pg.allreduce(ts, opts)
            if w is not None:
                w.wait()
        return leaf.tolist(), [p.tolist() for p in pair]

    for leaf, pair in ok(run_ranks(2, body)):
        assert leaf == [2.0, 2.0, 2.0]
        assert pair == [[3.0, 3.0], [2]]


@pytest.mark.parametrize("view", ["strided", "negated"])
def test_a_view_whose_memory_is_not_its_values_is_refused(view):
    # A strided view is not one piece of memory; a lazily negated one holds -x where it shows x
    # (its raw memory reduced with MAX would give the negated MIN): both refused, naming the cure.
    import torch.distributed as dist

    def body(c):
        pg = group(c)
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        opts.reduceOp = dist.ReduceOp.MAX
        x = torch.arange(8.0) + c.rank
        t = x[::2] if view == "strided" else torch._neg_view(x)
        pg.allreduce([t], opts)

    cure = "tensor.contiguous()" if view == "strided" else "tensor.resolve_neg()"
    for r in run_ranks(2, body):
        assert isinstance(r, ValueError) and cure in str(r), r
