"""The short causal convolution, forward + backward: torch's depthwise ``conv1d`` on the
transposed activations (as ShortConv ran it before) against ``ten.block_fused.causal_conv``
(Triton kernels on CUDA), on the same inputs, with the ratio and the largest difference:

    python benchmarks/bench_conv.py --device cuda                  # flagship: 1 x 32768 x 1024
    python benchmarks/bench_conv.py --device cpu --T 4096 --d 256  # CPU: both are torch's conv

Times are medians of ``--repeat`` runs after three warm-ups, synchronised on CUDA.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ten.block_fused import causal_conv  # noqa: E402


def torch_conv(xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """ShortConv's former path: (B, T, d) -> (B, d, T) -> conv1d -> (B, T, d)."""
    return F.conv1d(xp.transpose(1, 2), weight.unsqueeze(1).to(xp.dtype), bias.to(xp.dtype),
                    groups=xp.shape[-1]).transpose(1, 2)


def median_ms(fn, inputs, dy, device: torch.device, repeat: int) -> float:
    def once():
        for t in inputs:
            t.grad = None
        fn(*inputs).backward(dy)

    for _ in range(3):
        once()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        once()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=32768)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--W", type=int, default=4)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    device = torch.device(a.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    print(f"seed {a.seed}; B {a.B} x T {a.T} x d {a.d}, width {a.W}, {a.dtype}, {device}")
    g = torch.Generator().manual_seed(a.seed)
    xp = torch.randn(a.B, a.T + a.W - 1, a.d, generator=g).to(device, dtype).requires_grad_()
    weight = (0.5 * torch.randn(a.d, a.W, generator=g)).to(device).requires_grad_()
    bias = torch.randn(a.d, generator=g).to(device).requires_grad_()
    dy = torch.randn(a.B, a.T, a.d, generator=g).to(device, dtype)
    inputs = (xp, weight, bias)
    results = {}
    for name, fn in (("torch conv1d", torch_conv), ("causal_conv", causal_conv)):
        out = fn(*inputs)
        grads = torch.autograd.grad(out, inputs, dy)
        results[name] = (median_ms(fn, inputs, dy, device, a.repeat), out.detach().float(), grads)
    (t_ms, t_out, t_grads), (c_ms, c_out, c_grads) = results.values()
    for name, (ms, _, _) in results.items():
        print(f"{name:14s} forward + backward {ms:8.3f} ms")
    print(f"causal_conv / torch conv1d: {t_ms / c_ms:.2f}x faster")
    scale = t_out.abs().max()
    print(f"largest difference, relative to the largest value: output "
          f"{float((c_out - t_out).abs().max() / scale):.2e}; gradients " + ", ".join(
              f"{float((c.float() - t.float()).abs().max() / t.float().abs().max()):.2e}"
              for c, t in zip(c_grads, t_grads, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
