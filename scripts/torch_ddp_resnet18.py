#!/usr/bin/env python3
"""Peer baseline for `kolo train --model resnet18`: PyTorch DDP (Gloo, CPU, one thread per worker) training
the ResNet-18 of kolo (crates/kolo-models/src/resnet.rs) on Fashion-MNIST.

Usage: [MOMENTUM=m] [WEIGHT_DECAY=w] [TRAIN_LIMIT=N] [TEST_LIMIT=N] [MODEL=resnet18|lenet|mlp] [DEVICE=cpu|cuda]
       [PRECISION=f32|bf16] [WRAP=ddp|fsdp] python torch_ddp_resnet18.py N EPOCHS [BATCH] [LR]
       python torch_ddp_resnet18.py --check-against CHECKPOINT   (a kolo run directory, checkpoint directory or
                                                               model.safetensors: same tensors, shapes, counts?)
       python torch_ddp_resnet18.py --flops resnet18|lenet|mlp     (training FLOPs per sample, one JSON line)

The same interface and output as ../shared/peers/torch_ddp_lenet.py: per-epoch test accuracy and training
samples/s (`epoch E test_acc A epoch_s S samples_s R`), then a JSON summary line, which also holds
`train_flops_per_sample`. The defaults are those of `kolo train`: batch 64 per worker, SGD lr 0.05, momentum 0.9,
weight decay 0.

What matches `kolo train` (so that samples/s compare):
  model      d2l's ResNet-18 for small images: Conv2d(C, 64, 3, padding 1) + BN + ReLU (no max-pool), four stages
             of two residual blocks (64, 128, 256, 512 channels, stride 2 at the start of stages 2-4; block:
             conv3x3(stride)-BN-ReLU-conv3x3-BN, plus a 1x1 convolution with stride on the shortcut where channels
             or resolution change), add, ReLU; global average pooling, Linear(512, classes). Every convolution
             has a bias, the shortcut's too (as kolo's); BatchNorm eps 1e-5, momentum 0.1; PyTorch's default
             initialization (kolo reproduces it). Parameter names are kolo's (`--check-against` compares them).
  data       Fashion-MNIST from Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), 1x28x28,
             pixels / 255, no other normalization; TRAIN_LIMIT / TEST_LIMIT keep the first N samples
             (`kolo train --train-limit N --test-limit N`).
  training   DistributedSampler (shuffled, padded), the same batch per worker, incomplete last batch dropped,
             mean cross-entropy, SGD (PyTorch's: no dampening, no Nesterov), DDP with 25 MiB buckets; BatchNorm
             running statistics stay local during the epoch and rank 0's are copied to all before evaluating
             (kolo's `sync_buffers`; hence forward_sync_buffers=False, or broadcast_buffers=False in older torch). samples/s counts trained samples of all
             workers over the epoch's training time (no evaluation).
On GPUs (DEVICE=cuda, `kolo train --device cuda`'s peer): DDP on NCCL, worker r on GPU r % GPUs, each batch
copied to the GPU as kolo's loader does, TF32 off (kolo's candle computes f32 convolutions and products in f32),
the epoch timed after torch.cuda.synchronize(). MODEL=lenet trains kolo's LeNet instead of the ResNet-18, MODEL=mlp its MLP.

PRECISION=bf16 (`kolo train --precision bf16`'s peer): the forward pass and the loss under
torch.autocast(device, dtype=torch.bfloat16), PyTorch's mixed precision (f32 weights and optimizer, bf16
convolutions and products: on CPUs with AMX or AVX512-BF16 oneDNN runs them there); the backward pass outside it,
as PyTorch's documentation says; evaluation in f32.

WRAP=fsdp (`bench_train.py --torch-backends --wrap fsdp`): PyTorch's FSDP2 instead of DDP, fully_shard on every
residual block (ResNet-18) or linear layer (MLP, LeNet) and on the model, each worker holding 1/N of every
parameter, all-gathering them for forward and backward and reduce-scattering the gradients (ZeRO-3's
communication: 3 (N-1)/N of the parameters per step, against DDP's 2); BatchNorm buffers are then full on every
worker and still copied from rank 0 before evaluating.

FLOPs are those torch.utils.flop_counter.FlopCounterMode counts (convolutions and matrix products, forward and
backward; not BatchNorm, ReLU, pooling, loss or optimizer). Needs only torch (no numpy).
"""
import argparse, gzip, inspect, json, math, os, struct, sys, time, warnings
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy: not needed here
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

D = "/usr/share/datasets/fashion-mnist"


def idx(path, off):
    with gzip.open(path) as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8, offset=off)


def load(split, limit=0):
    x = idx(f"{D}/{split}-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).to(torch.float32) / 255.0
    y = idx(f"{D}/{split}-labels-idx1-ubyte.gz", 8).to(torch.int64)
    if limit and limit < len(y):
        x, y = x[:limit], y[:limit]
    return x, y


class Residual(nn.Module):
    """conv3x3(stride)-BN-ReLU-conv3x3-BN, plus a 1x1 convolution (with stride, bias, no BN) on the shortcut
    where channels or resolution change; add, ReLU."""

    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(c_out, eps=1e-5, momentum=0.1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(c_out, eps=1e-5, momentum=0.1)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride, 0) if c_in != c_out or stride != 1 else None

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class Resnet18(nn.Module):
    def __init__(self, channels=1, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 64, 3, 1, 1)
        self.bn1 = nn.BatchNorm2d(64, eps=1e-5, momentum=0.1)
        c_in = 64
        for stage, (c, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)]):
            blocks = []
            for block in range(2):
                blocks.append(Residual(c_in, c, stride if block == 0 else 1))
                c_in = c
            setattr(self, f"layer{stage + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for stage in range(1, 5):
            x = getattr(self, f"layer{stage}")(x)
        return self.fc(x.mean((2, 3)))


class Lenet(nn.Module):
    """The LeNet of kolo and of ../shared/peers/torch_ddp_lenet.py (there an nn.Sequential), with kolo's names."""

    def __init__(self, channels=1, classes=10):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(channels, 6, 5, padding=2), nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, classes)

    def forward(self, x):
        x = F.avg_pool2d(F.relu(self.conv1(x)), 2)
        x = F.avg_pool2d(F.relu(self.conv2(x)), 2).flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Mlp(nn.Module):
    """kolo's MLP (its default hidden sizes 256 and 128) with kolo's names."""

    def __init__(self, channels=1, classes=10, hidden=(256, 128), side=28):
        super().__init__()
        dims = [channels * side * side, *hidden, classes]
        for i in range(len(dims) - 1):
            setattr(self, f"fc{i + 1}", nn.Linear(dims[i], dims[i + 1]))
        self.layers = len(dims) - 1

    def forward(self, x):
        x = x.flatten(1)
        for i in range(1, self.layers):
            x = F.relu(getattr(self, f"fc{i}")(x))
        return getattr(self, f"fc{self.layers}")(x)


MODELS = {"resnet18": Resnet18, "lenet": Lenet, "mlp": Mlp}


def train_flops_per_sample(model_name, shape=(1, 28, 28), classes=10, batch=4):
    """FLOPs of one training sample (forward and backward, as FlopCounterMode counts them) of a fresh model."""
    from torch.utils.flop_counter import FlopCounterMode
    model = MODELS[model_name](shape[0], classes).train()
    x, y = torch.randn(batch, *shape), torch.arange(batch) % classes
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / batch


def safetensors_header(path):
    """{name: {"dtype", "shape", "data_offsets"}} of a safetensors file (its JSON header; no safetensors package)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        n = struct.unpack("<Q", raw)[0]
        if n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def checkpoint_file(path):
    """model.safetensors of a kolo run directory (its newest checkpoint), a checkpoint directory, or the file."""
    if os.path.isdir(os.path.join(path, "checkpoints")):
        ck = os.path.join(path, "checkpoints")
        with open(os.path.join(ck, "latest")) as f:
            path = os.path.join(ck, f.read().strip())
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    return path


def check_against(path):
    """Compares kolo's checkpoint with this script's model: tensor names, shapes and element counts. Returns the
    JSON-able report; report["ok"] says whether they agree."""
    path = checkpoint_file(path)
    kolo = {k: tuple(v["shape"]) for k, v in safetensors_header(path).items()}
    name, fc = ("resnet18", "fc.weight") if "layer1.0.conv1.weight" in kolo else ("lenet", "fc3.weight")
    if "conv1.weight" not in kolo or fc not in kolo:
        raise ValueError(f"{path}: neither kolo's resnet18 nor its lenet (no conv1.weight or {fc})")
    classes = kolo[fc][0]
    model = MODELS[name](kolo["conv1.weight"][1], classes)
    # num_batches_tracked counts steps (only used with momentum=None); kolo has no such buffer.
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    params = {k for k, _ in model.named_parameters()}
    count = lambda d, keys: sum(math.prod(d[k]) for k in keys)
    rep = {
        "check": path, "model": name, "kolo_tensors": len(kolo), "torch_tensors": len(ours),
        "kolo_elements": count(kolo, kolo), "torch_elements": count(ours, ours),
        "torch_parameters": count(ours, params), "torch_buffers": count(ours, set(ours) - params),
        "only_in_kolo": sorted(set(kolo) - set(ours)), "only_in_torch": sorted(set(ours) - set(kolo)),
        "shape_mismatches": {k: [kolo[k], ours[k]] for k in sorted(set(kolo) & set(ours)) if kolo[k] != ours[k]},
    }
    rep["ok"] = not (rep["only_in_kolo"] or rep["only_in_torch"] or rep["shape_mismatches"])
    return rep


def evaluate(model, x, y, rank, n, dev=torch.device("cpu"), batch=256):
    """Test accuracy over all ranks, each evaluating its share (rank, rank + n, ...), as kolo's eval sampler."""
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64, device=dev)
    with torch.no_grad():
        xs, ys = x[rank::n], y[rank::n]
        for i in range(0, len(ys), batch):
            correct[0] += (model(xs[i:i + batch].to(dev)).argmax(1).cpu() == ys[i:i + batch]).sum().item()
        correct[1] = len(ys)
    dist.all_reduce(correct)
    return (correct[0] / correct[1].clamp(min=1)).item()


def run(rank, n, epochs, bs, lr, port, flops):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    gpu = os.environ.get("DEVICE", "cpu") == "cuda"
    name = os.environ.get("MODEL", "resnet18")
    if gpu:
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        dist.init_process_group("nccl", rank=rank, world_size=n, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=n)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    bf16 = os.environ.get("PRECISION", "f32") == "bf16"
    if os.environ.get("PRECISION", "f32") not in ("f32", "bf16"):
        sys.exit(f"torch_ddp_resnet18: PRECISION={os.environ['PRECISION']}: f32 or bf16")
    torch.manual_seed(0)
    xtr, ytr = load("train", int(os.environ.get("TRAIN_LIMIT", "0")))
    xte, yte = load("t10k", int(os.environ.get("TEST_LIMIT", "0")))
    net = MODELS[name](1, 10).to(dev)
    # Buffers copied once at construction, not before every forward (newer torch names it forward_sync_buffers).
    keep = {"forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters
            else "broadcast_buffers": False}
    wrap = os.environ.get("WRAP", "ddp")
    if wrap == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(dev.type, (n,))
        for m in net.modules():
            if isinstance(m, (Residual, nn.Linear)) or (name == "lenet" and isinstance(m, nn.Conv2d)):
                fully_shard(m, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    elif wrap == "ddp":
        model = DDP(net, bucket_cap_mb=25, device_ids=[dev.index] if gpu else None, **keep)
    else:
        sys.exit(f"torch_ddp_resnet18: WRAP={wrap}: ddp or fsdp")
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=float(os.environ.get("MOMENTUM", "0.9")),
                          weight_decay=float(os.environ.get("WEIGHT_DECAY", "0")))
    sampler = torch.utils.data.DistributedSampler(range(len(xtr)), num_replicas=n, rank=rank, shuffle=True, seed=0)
    t_all = time.perf_counter(); seen = 0; train_s = 0.0; first88 = None; acc = 0.0
    for ep in range(epochs):
        sampler.set_epoch(ep); idxs = torch.tensor(list(sampler)); model.train(); sync(); t0 = time.perf_counter()
        steps = 0
        for i in range(0, len(idxs) - bs + 1, bs):
            b = idxs[i:i + bs]; opt.zero_grad()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(xtr[b].to(dev)), ytr[b].to(dev))
            loss.backward(); opt.step()
            steps += 1
        sync()
        dt = time.perf_counter() - t0
        seen += steps * bs * n; train_s += dt
        for buf in net.buffers():  # rank 0's running statistics for evaluation, as kolo's sync_buffers
            dist.broadcast(buf, 0)
        acc = evaluate(net, xte, yte, rank, n, dev)
        if rank == 0:
            print(f"epoch {ep+1} test_acc {acc:.4f} epoch_s {dt:.2f} samples_s {steps * bs * n / max(dt, 1e-9):.1f}",
                  flush=True)
        if first88 is None and acc >= 0.88: first88 = time.perf_counter() - t_all
    if rank == 0:
        tot = time.perf_counter() - t_all
        print(json.dumps({"impl": f"torch-{wrap}-" + ("nccl" if gpu else dist.get_backend()), "model": name, "n": n, "epochs": epochs, "batch": bs,
                          "precision": "bf16" if bf16 else "f32",
                          "lr": lr, "train_samples": seen, "final_acc": round(acc, 4),
                          "train_samples_per_s": round(seen / max(train_s, 1e-9), 1), "secs_to_88": first88,
                          "total_s": round(tot, 1), "train_flops_per_sample": flops}))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, nargs="?", help="workers")
    ap.add_argument("epochs", type=int, nargs="?")
    ap.add_argument("batch", type=int, nargs="?", default=64, help="per worker (default 64)")
    ap.add_argument("lr", type=float, nargs="?", default=0.05, help="default 0.05")
    ap.add_argument("--check-against", metavar="CHECKPOINT",
                    help="compare with a kolo checkpoint (run dir, checkpoint dir or model.safetensors) and exit")
    ap.add_argument("--flops", choices=sorted(MODELS), help="print the training FLOPs per sample and exit")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.check_against:
        try:
            rep = check_against(a.check_against)
        except (OSError, ValueError) as e:
            sys.exit(f"torch_ddp_resnet18: {e}")
        print(json.dumps(rep))
        sys.exit(0 if rep["ok"] else 1)
    if a.flops:
        print(json.dumps({"model": a.flops, "train_flops_per_sample": train_flops_per_sample(a.flops)}))
        return
    if a.n is None or a.epochs is None or a.n < 1 or a.epochs < 1 or a.batch < 1:
        ap.error("N and EPOCHS (and BATCH) must be positive integers")
    flops = train_flops_per_sample(os.environ.get("MODEL", "resnet18"))
    mp.spawn(run, args=(a.n, a.epochs, a.batch, a.lr, 29000 + os.getpid() % 1000, flops), nprocs=a.n)


if __name__ == "__main__":
    main()
