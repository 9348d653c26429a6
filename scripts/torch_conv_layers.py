#!/usr/bin/env python3
"""PyTorch's side of kolo-nn's `conv_layers` example: the same convolution layers (ResNet-18's 3x3
layers on 28x28 inputs, batch 32; no bias), forward + backward (input and kernel gradients), one
thread, best of --repeats, in f32 or under torch.autocast("cpu", dtype=torch.bfloat16) -- so that
kolo's convolutions can be set against oneDNN's layer by layer:

    RAYON_NUM_THREADS=1 target/release/examples/conv_layers --candle off --dtype f32 --repeats 3
    ~/.cache/kolo/torch-2.15.0/bin/python scripts/torch_conv_layers.py --precision f32 --repeats 3

(`--dtype f32-bf16gemm` on kolo's side for the bf16 comparison.) Prints one line per layer (ms for
the forward pass and for forward + backward, and the direct convolution's GFLOP/s, three passes per
step) and a JSON line with the total step time over all layers (each layer counted as often as
ResNet-18 has it).
"""

import argparse
import json
import time

import torch

# (output channels, input side, stride, how many ResNet-18 has); input channels are half the
# output channels where the layer strides.
LAYERS = [(64, 28, 1, 4), (128, 28, 2, 1), (128, 14, 1, 3), (256, 14, 2, 1), (256, 7, 1, 3),
          (512, 7, 2, 1), (512, 4, 1, 3)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    if a.repeats < 1 or a.batch < 1:
        ap.error("--repeats and --batch must be at least 1")
    torch.set_num_threads(1)
    total = 0.0
    for c, side, stride, count in LAYERS:
        c_in = c // 2 if stride == 2 else c
        conv = torch.nn.Conv2d(c_in, c, 3, stride, 1, bias=False)
        x = torch.randn(a.batch, c_in, side, side, requires_grad=True)
        best_fwd = best = float("inf")
        for r in range(a.repeats + 1):  # the first one warms up
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                t0 = time.perf_counter()
                y = conv(x)
                t1 = time.perf_counter()
            y.float().sum().backward()
            t2 = time.perf_counter()
            if r:
                best_fwd, best = min(best_fwd, t1 - t0), min(best, t2 - t0)
            x.grad = None
            conv.weight.grad = None
        out = (side + 2 - 3) // stride + 1
        gflops = 2 * a.batch * c_in * c * 9 * out * out * 3 / best / 1e9
        total += best * count
        print(f"{c:4} ch {side:2}x{side:<2} stride {stride} (x{count}): forward {best_fwd * 1e3:7.2f} ms, "
              f"step {best * 1e3:7.2f} ms, {gflops:6.1f} GFLOP/s")
    print(json.dumps({"precision": a.precision, "batch": a.batch, "step_ms": round(total * 1e3, 2),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
