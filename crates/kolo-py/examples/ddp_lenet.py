"""PyTorch DDP training LeNet on Fashion-MNIST — a plain PyTorch program whose only kolo part is
the backend name. Under torchrun:

    torchrun --nproc_per_node 2 crates/kolo-py/examples/ddp_lenet.py [--backend kolo|gloo]
        [--epochs 10] [--batch 64] [--lr 0.05] [--momentum 0.9] [--data /usr/share/datasets/fashion-mnist]
        [--limit N]

One thread per worker; DistributedSampler shards the 60,000 training images; rank 0 prints the test
accuracy and samples/s of every epoch and a JSON summary. The data is Debian's
dataset-fashion-mnist (the IDX files, gzipped).
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def load(data, split):
    x = idx(f"{data}/{split}-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    y = idx(f"{data}/{split}-labels-idx1-ubyte.gz", 8).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def lenet():
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="kolo")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--limit", type=int, default=0, help="train on the first N images only (0: all)")
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    if a.limit:
        xtr, ytr = xtr[:a.limit], ytr[:a.limit]
    # ANCHOR: backend
    dist.init_process_group(backend=a.backend)  # "kolo" (this script's default) or "gloo"
    model = nn.parallel.DistributedDataParallel(lenet())
    # ANCHOR_END: backend
    rank, n = dist.get_rank(), dist.get_world_size()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    sampler = torch.utils.data.DistributedSampler(range(len(xtr)), num_replicas=n, rank=rank, shuffle=True, seed=0)
    start, seen, acc = time.perf_counter(), 0, 0.0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        model.train()
        t0 = time.perf_counter()
        for i in range(0, len(order) - a.batch + 1, a.batch):
            b = order[i:i + a.batch]
            opt.zero_grad()
            F.cross_entropy(model(xtr[b]), ytr[b]).backward()
            opt.step()
            seen += a.batch * n
        dt = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch + 1} test_acc {acc:.4f} epoch_s {dt:.2f} samples_s {len(order) * n / dt:.0f}",
                  flush=True)
    if rank == 0:
        total = time.perf_counter() - start
        print(json.dumps({"backend": a.backend, "workers": n, "epochs": a.epochs, "batch": a.batch,
                          "final_acc": round(acc, 4), "train_samples_per_s": round(seen / total, 1),
                          "total_s": round(total, 1)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
