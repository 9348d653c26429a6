"""One rank of the torch backend tests, started by torchrun (or by hand with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT): `python torch_worker.py SCENARIO`. Prints `PASS <check>` per check
and exits 0 when all hold."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import kolo


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {name} failed {detail}")
    say(f"PASS {name}")


def say(line):
    # One write per line: the ranks share torchrun's pipe, and print() may split a line.
    os.write(1, (line + "\n").encode())


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def collectives():
    r, n = dist.get_rank(), dist.get_world_size()
    ranks = list(range(n))
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.uint8]:
        for op, ref in [(dist.ReduceOp.SUM, sum(k + 1 for k in ranks)),
                        (dist.ReduceOp.MAX, n), (dist.ReduceOp.MIN, 1),
                        (dist.ReduceOp.PRODUCT, eval("*".join(str(k + 1) for k in ranks)))]:
            x = torch.full((5,), r + 1, dtype=dtype)
            dist.all_reduce(x, op=op)
            check(f"all_reduce {dtype} {op}", bool((x == ref).all()), x)
    x = torch.tensor([r == 0, False, True])
    dist.all_reduce(x)
    check("all_reduce bool (logical or)", x.tolist() == [True, False, True])
    x = torch.full((3,), float(r + 1))
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    check("all_reduce avg", torch.allclose(x, torch.full((3,), sum(k + 1 for k in ranks) / n)))

    x = torch.arange(4, dtype=torch.float32) * (r + 1)
    dist.broadcast(x, src=n - 1)
    check("broadcast", torch.equal(x, torch.arange(4, dtype=torch.float32) * n))

    outs = [torch.empty(2) for _ in ranks]
    dist.all_gather(outs, t([r, r + 0.5]))
    check("all_gather list", all(torch.equal(o, t([k, k + 0.5])) for k, o in zip(ranks, outs)))

    out = torch.empty(n * 2, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([r, -r]))
    check("all_gather_into_tensor", out.tolist() == sum(([k, -k] for k in ranks), []))

    out = torch.empty(n * 3)
    dist.all_gather_into_tensor(out, out[r * 3 : (r + 1) * 3].fill_(r))  # in place
    check("all_gather_into_tensor in place", out.tolist() == sum(([float(k)] * 3 for k in ranks), []))

    x = torch.full((3,), float(r + 1))
    dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)
    if r == 0:
        check("reduce", bool((x == sum(k + 1 for k in ranks)).all()))

    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(2 * n, dtype=torch.float32) + r)
    want = [float(sum(2 * r + i + k for k in ranks)) for i in range(2)]
    check("reduce_scatter_tensor", out.tolist() == want, out)

    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(k + r)) for k in ranks])
    check("reduce_scatter list", out.tolist() == [float(sum(r + k for k in ranks))] * 2)

    gl = [torch.empty(1) for _ in ranks] if r == 0 else None
    dist.gather(t([r * 10]), gather_list=gl, dst=0)
    if r == 0:
        check("gather", [g.item() for g in gl] == [k * 10.0 for k in ranks])

    out = torch.empty(2)
    dist.scatter(out, [t([k, k]) for k in ranks] if r == 0 else None, src=0)
    check("scatter", out.tolist() == [float(r)] * 2)

    out = torch.empty(n)
    dist.all_to_all_single(out, torch.arange(n, dtype=torch.float32) + 10 * r)
    check("all_to_all_single", out.tolist() == [float(r + 10 * k) for k in ranks], out)

    outs = [torch.empty(1) for _ in ranks]
    dist.all_to_all(outs, [t([100 * r + k]) for k in ranks])
    check("all_to_all list", [o.item() for o in outs] == [float(100 * k + r) for k in ranks])

    if n >= 2:
        if r == 0:
            dist.send(t([42, 43]), dst=1)
        elif r == 1:
            buf = torch.empty(2)
            dist.recv(buf, src=0)
            check("send/recv", buf.tolist() == [42.0, 43.0])

    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r})
    check("all_gather_object", objs == [{"rank": k} for k in ranks])
    lst = [{"from": 0}] if r == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    check("broadcast_object_list", lst == [{"from": 0}])

    w = dist.all_reduce(torch.ones(1000), async_op=True)
    fut = w.get_future()
    w.wait()
    check("async work's future holds the tensors", torch.equal(fut.value()[0], torch.full((1000,), float(n))))

    outs = [torch.empty(n * 2), torch.empty(n)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], t([r, r]))
        dist.all_gather_into_tensor(outs[1], t([10 * r]))
    cm.wait()
    check("coalesced all_gather_into_tensor", outs[0].tolist() == sum(([float(k)] * 2 for k in ranks), [])
          and outs[1].tolist() == [10.0 * k for k in ranks], outs)

    sub = dist.new_group([0, n - 1]) if n > 1 else dist.new_group([0])
    if r in (0, n - 1):
        x = torch.ones(1)
        dist.all_reduce(x, group=sub)
        check("new_group all_reduce", x.item() == float(len({0, n - 1})))
    # torch's split_group over the kolo group: each split keeps its order (the even ranks
    # reversed), a rank left out of every split gets no group.
    splits = [[k for k in ranks if k % 2 == 0][::-1], [k for k in ranks if k % 2 == 1]]
    splits = [s for s in splits if s]
    g = dist.split_group(split_ranks=splits)
    mine = next(s for s in splits if r in s)
    x = torch.tensor([float(r)])
    dist.all_reduce(x, group=g)
    check("split_group all_reduce", x.item() == float(sum(mine))
          and dist.get_rank(g) == mine.index(r) and dist.get_process_group_ranks(g) == mine,
          (x, mine))
    h = dist.split_group(split_ranks=[[k for k in ranks if k != 0]]) if n > 1 else None
    if r == 0:
        check("split_group non-member", h is None or h is dist.GroupMember.NON_GROUP_MEMBER, h)
    else:
        y = torch.ones(1)
        dist.all_reduce(y, group=h)
        check("split_group non-member", y.item() == float(n - 1), y)
    # A barrier holds every rank until the last arrives (the last rank comes 0.3 s late): no rank
    # leaves before the last arrival.
    for name, barrier in [("barrier", dist.barrier),
                          ("monitored_barrier", lambda: kolo.torch.monitored_barrier(timeout=10))]:
        if r == n - 1:
            time.sleep(0.3)
        arrived = time.time()
        barrier()
        left = time.time()
        stamps = [None] * n
        dist.all_gather_object(stamps, (arrived, left))
        last = max(a for a, _ in stamps)
        check(name, all(gone >= last - 0.005 for _, gone in stamps), f"(arrived, left): {stamps}")


def ddp():
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    ref = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    ref.load_state_dict(model.state_dict())
    ddp_model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    torch.manual_seed(100)
    inputs = [torch.randn(4, 5) for _ in range(n)]  # rank k trains on inputs[k]
    ddp_model(inputs[r]).square().sum().backward()
    grads = [p.grad.clone() for p in ddp_model.parameters()]
    # The mean of every rank's local gradient, computed here on one model.
    local = []
    for k in range(n):
        ref.zero_grad()
        ref(inputs[k]).square().sum().backward()
        local.append([p.grad.clone() for p in ref.parameters()])
    mean = [sum(g[i] for g in local) / n for i in range(len(grads))]
    check("DDP gradients are the mean of the local gradients",
          all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, mean)))


def mismatch():
    r = dist.get_rank()
    start = time.monotonic()
    try:
        if r == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.broadcast(torch.ones(4), src=0)
    except Exception as e:  # noqa: BLE001
        text = str(e)
        other = 1 - r
        check("mismatch raises", isinstance(e, kolo.MismatchError), repr(e))
        check("names the other rank", f"rank {other}" in text, text)
        check("names both calls", "all_reduce" in text and "broadcast" in text, text)
        check("within seconds", time.monotonic() - start < 10)
        return
    raise AssertionError(f"rank {r}: no error")


def dead():
    r = dist.get_rank()
    dist.barrier()
    if r == 1:
        os._exit(3)  # dies without a word
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 16))
    except kolo.PeerError as e:
        check("a dead rank is a PeerError naming it", e.peer == 1 and "rank 1" in str(e), e)
        check("within seconds", time.monotonic() - start < 15, time.monotonic() - start)
        return
    raise AssertionError("no error")


def bad_input():
    r = dist.get_rank()
    cases = [
        ("non-contiguous", lambda: torch.ones(4, 4)[:, 0], dist.ReduceOp.SUM, ValueError, "contiguous"),
        ("GPU-less device", lambda: torch.ones(4, device="meta"), dist.ReduceOp.SUM, ValueError, "meta"),
        ("int8 dtype", lambda: torch.ones(4, dtype=torch.int8), dist.ReduceOp.SUM, TypeError, "int8"),
        ("int16 dtype", lambda: torch.ones(4, dtype=torch.int16), dist.ReduceOp.SUM, TypeError, "int16"),
        ("bitwise op", lambda: torch.ones(4, dtype=torch.int32), dist.ReduceOp.BAND, ValueError, "reduction"),
    ]
    for name, make, op, exc, words in cases:
        g = dist.new_group(list(range(dist.get_world_size())))
        try:
            if r == 0:
                dist.all_reduce(make(), op=op, group=g)
            else:
                dist.all_reduce(torch.ones(4), group=g)
        except Exception as e:  # noqa: BLE001
            if r == 0:
                check(f"{name}: {exc.__name__} on the rank that passed it", isinstance(e, exc) and words in str(e), repr(e))
            else:
                check(f"{name}: the peer fails at once, naming rank 0", isinstance(e, kolo.PeerError) and "rank 0" in str(e), repr(e))
            continue
        raise AssertionError(f"{name}: rank {r} raised nothing")


def train():
    # A small CNN trained with DDP for 20 steps on fixed random data; the parameters' sums at the
    # end (compared across backends by the test).
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    ddp_model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = torch.randn(20, n, 8, 1, 8, 8, generator=g)
    labels = torch.randint(0, 10, (20, n, 8), generator=g)
    for step in range(20):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp_model(data[step, r]), labels[step, r])
        loss.backward()
        opt.step()
    sums = " ".join(f"{p.detach().double().sum().item():.9g}" for p in ddp_model.parameters())
    say(f"PARAMS {sums}")


def sharded():
    # PyTorch's sharded training on the backend: FSDP2 (fully_shard, per layer), FSDP1 on the CPU,
    # ZeroRedundancyOptimizer with DDP, tensor and pipeline parallelism, and torch.distributed.checkpoint saving FSDP2's sharded
    # state and loading it into a fresh model. Each rank trains on its own fixed random batches;
    # the mean losses (compared across backends by the test) and whether the load gave back the
    # saved parameters.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    r, n = dist.get_rank(), dist.get_world_size()

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def fsdp2():
        m = model()
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(m, mesh=mesh)

    def train(m, opt, steps=4, same_batches=False):
        # Each rank its own batches, or (tensor parallelism) every rank the same ones.
        g = torch.Generator().manual_seed(1 if same_batches else 1 + r)
        losses = []
        for _ in range(steps):
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / n)
        return losses

    mesh = init_device_mesh("cpu", (n,))
    m = fsdp2()
    say("LOSSES fsdp2 " + " ".join(f"{x:.9g}" for x in train(m, torch.optim.AdamW(m.parameters(), lr=1e-2))))
    m = FSDP(model(), use_orig_params=True, device_id=torch.device("cpu"))
    say("LOSSES fsdp1 " + " ".join(f"{x:.9g}" for x in train(m, torch.optim.AdamW(m.parameters(), lr=1e-2))))
    m = nn.parallel.DistributedDataParallel(model())
    zero = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
    say("LOSSES zero " + " ".join(f"{x:.9g}" for x in train(m, zero)))
    zero.consolidate_state_dict(0)
    # Tensor parallelism (DTensor): the first layer's columns and the second's rows split over
    # the ranks, the same batches on every rank.
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    m = parallelize_module(model(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    tp = train(m, torch.optim.SGD(m.parameters(), lr=0.1), same_batches=True)
    say("LOSSES tp " + " ".join(f"{x:.9g}" for x in tp))
    # Pipeline parallelism: the model cut in two stages (one rank each, the last one with the
    # loss), GPipe over 4 micro-batches of each batch; the activations and their gradients go
    # between the stages by send and recv.
    if n == 2:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
        stage_module = [model()[:2], model()[2:]][r]
        stage = PipelineStage(stage_module, r, n, torch.device("cpu"))
        gpipe = ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.cross_entropy)
        opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        pp = []
        for _ in range(4):
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            losses = []
            if r == 0:
                gpipe.step(x)
            else:
                gpipe.step(target=y, losses=losses)
                pp.append(torch.stack(losses).mean().item())
            opt.step()
            opt.zero_grad()
        if r == 1:
            say("LOSSES pp " + " ".join(f"{x:.9g}" for x in pp))
    m = fsdp2()
    train(m, torch.optim.SGD(m.parameters(), lr=0.1), steps=2)
    where = [os.environ["CHECKPOINT_DIR"]]
    dcp.save({"model": m.state_dict()}, checkpoint_id=where[0])
    fresh = fsdp2()
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=where[0])
    fresh.load_state_dict(state["model"])
    check("checkpoint loads the saved parameters",
          all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(m.parameters(), fresh.parameters())))


if __name__ == "__main__":
    scenario = sys.argv[1]
    backend = os.environ.get("BACKEND", "kolo")
    dist.init_process_group(backend=backend)
    check(f"backend is {backend}", dist.get_backend() == backend)
    {"collectives": collectives, "ddp": ddp, "mismatch": mismatch, "dead": dead,
     "bad_input": bad_input, "train": train, "sharded": sharded}[scenario]()
    if scenario != "dead":
        dist.destroy_process_group()
    say("DONE")
    if backend == "gloo":
        # PyTorch's Gloo now and then aborts in its teardown after a complete run ("terminate
        # called without an active exception"); the reference run must not fail for that.
        os._exit(0)
