"""Peer baseline on GPUs: torch.distributed all_reduce on the NCCL backend (float32 GPU tensors),
timed as nccl-tests does (warm-up, then the mean of many in-place reductions queued back to back and
synchronized once), printing the JSON lines of ../shared/peers/gloo_allreduce.py and of
`kolo bench allreduce --device cuda --json`. Worker r uses GPU r % GPUs; with more workers than
GPUs they share them (NCCL_HOSTID per worker and NCCL_MULTI_RANK_GPU_ENABLE, as scripts/gpu-check.sh
does): enough to compare kolo's and PyTorch's overheads on NCCL, not to measure a GPU interconnect.

Usage: python3 scripts/nccl_allreduce.py N [bytes ...]   (needs torch with CUDA)"""
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

SIZES = [4, 1024, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def run(rank, n, sizes, port):
    gpus = torch.cuda.device_count()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if n > gpus:
        os.environ.update(NCCL_HOSTID=f"nccl-allreduce-{rank}", NCCL_MULTI_RANK_GPU_ENABLE="1",
                          NCCL_SOCKET_IFNAME=os.environ.get("NCCL_SOCKET_IFNAME", "lo"))
    dev = torch.device("cuda", rank % gpus)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=n, device_id=dev)
    for b in sizes:
        count = max(b // 4, 1)
        base = (torch.arange(count, device=dev) % 7).float() + rank
        iters = 1000 if b < (1 << 20) else (50 if b < (16 << 20) else 10)
        t = base.clone()
        for _ in range(5):
            dist.all_reduce(t)
        dist.barrier()
        torch.cuda.synchronize()
        s = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dt = torch.tensor([(time.perf_counter() - s) / iters], device=dev)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank, as kolo bench
        dt = dt.item()
        t = base.clone(); dist.all_reduce(t)
        want = (torch.arange(count, device=dev) % 7).float() * n + n * (n - 1) / 2
        wrong = torch.tensor([int((t != want).sum())], device=dev)
        dist.all_reduce(wrong)
        if rank == 0:
            alg = count * 4 / dt / 1e9
            print(json.dumps({"impl": "torch-nccl", "op": "allreduce", "n": n, "bytes": count * 4,
                              "time_us": round(dt * 1e6, 3), "algbw_gbps": round(alg, 4),
                              "busbw_gbps": round(alg * 2 * (n - 1) / n, 4), "wrong": int(wrong.item())}),
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    sizes = [int(x) for x in sys.argv[2:]] or SIZES
    mp.spawn(run, args=(n, sizes, 29000 + os.getpid() % 1000), nprocs=n)
