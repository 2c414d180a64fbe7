"""The short causal convolution at a sequence's start, forward + backward: torch's
depthwise ``conv1d`` on the zero-padded, transposed activations (as ShortConv ran it
before) against ``ten.kernels.block_fused.causal_conv`` (Triton kernels on CUDA, no padded copy),
on the same inputs, with the time ratio and the largest difference:

    python benchmarks/bench_conv.py --device cuda                  # flagship: 1 x 32768 x 1024
    python benchmarks/bench_conv.py --device cpu --T 4096 --d 256  # CPU: both are torch's conv
    python benchmarks/bench_conv.py --device cuda --tiles          # the backward kernel's tiles

``--tiles`` times the backward kernel alone at each of
``ten.kernels.block_kernels.CONV_BACKWARD_CANDIDATES`` (the shipped tile first), its bytes
over its time, and checks each gives the shipped tile's d x bit for bit.

Times are medians of ``--repeat`` runs after three warm-ups, synchronised on CUDA.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import median_ms  # noqa: E402

from ten.kernels.block_fused import causal_conv  # noqa: E402


def torch_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """ShortConv's former path: W - 1 zero rows in front of x (a copy), (B, W-1+T, d) ->
    (B, d, W-1+T) -> conv1d -> (B, T, d)."""
    xp = torch.cat([x.new_zeros(x.shape[0], weight.shape[1] - 1, x.shape[2]), x], dim=1)
    return F.conv1d(xp.transpose(1, 2), weight.unsqueeze(1).to(xp.dtype), bias.to(xp.dtype),
                    groups=xp.shape[-1]).transpose(1, 2)


def ten_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """ShortConv's path: ten's operator from a sequence's start (no tail)."""
    return causal_conv(x, None, weight, bias)


def compare(B: int, T: int, d: int, W: int, dtype: torch.dtype, device: torch.device,
            repeat: int, seed: int = 0) -> dict:
    """Both paths on the same inputs: their times (ms), the ratio, and the largest
    differences relative to the largest value (output, then d x, d weight, d bias)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, d, generator=g).to(device, dtype).requires_grad_()
    weight = (0.5 * torch.randn(d, W, generator=g)).to(device).requires_grad_()
    bias = torch.randn(d, generator=g).to(device).requires_grad_()
    dy = torch.randn(B, T, d, generator=g).to(device, dtype)
    inputs = (x, weight, bias)
    runs = {}
    for name, fn in (("torch_ms", torch_conv), ("causal_conv_ms", ten_conv)):
        out = fn(*inputs)
        grads = torch.autograd.grad(out, inputs, dy)
        def once(fn=fn):
            for t in inputs:
                t.grad = None
            fn(*inputs).backward(dy)

        runs[name] = (median_ms(once, device, repeat),
                      [t.detach().float() for t in (out, *grads)])
    (t_ms, want), (c_ms, got) = runs.values()
    return {"B": B, "T": T, "d": d, "W": W, "torch_ms": t_ms, "causal_conv_ms": c_ms,
            "speedup": t_ms / c_ms, "max_rel_error": [
                float((o - w).abs().max() / w.abs().max()) for o, w in zip(got, want,
                                                                           strict=True)]}


def tiles(B: int, T: int, d: int, W: int, dtype: torch.dtype, device: torch.device,
          repeat: int, seed: int = 0) -> dict:
    """The backward kernel at each candidate tile on the same inputs (from a sequence's
    start, as training runs it): ms, GB/s of the bytes it must move (dy and x read, d x
    written; the weight-gradient shares are < 1% at the flagship's T), and whether its d x
    equals the shipped tile's. On a CPU they run only in Triton's interpreter
    (TRITON_INTERPRET=1, which the suite's smoke run sets: the figures then mean nothing,
    the run checks the wiring)."""
    from ten.kernels import block_kernels as bk

    g = torch.Generator().manual_seed(seed)
    x, dy = (torch.randn(B, T, d, generator=g).to(device, dtype) for _ in range(2))
    weight = (0.5 * torch.randn(d, W, generator=g)).to(device)
    bias = torch.randn(d, generator=g).to(device)
    nbytes = 3 * B * T * d * x.element_size()
    shipped = bk.causal_conv_backward(dy, x, None, weight, bias)[0]
    rows = []
    for tile in bk.CONV_BACKWARD_CANDIDATES:
        dx = bk.causal_conv_backward(dy, x, None, weight, bias, tiles=tile)[0]
        ms = median_ms(lambda tile=tile: bk.causal_conv_backward(dy, x, None, weight, bias,
                                                                tiles=tile), device, repeat)
        rows.append({"tiles": str(tile), "ms": ms, "gbps": nbytes / ms / 1e6,
                     "dx_equal": bool(torch.equal(dx, shipped))})
    fastest = min(rows, key=lambda r: r["ms"])
    return {"B": B, "T": T, "d": d, "W": W, "bytes": nbytes, "rows": rows,
            "fastest": fastest["tiles"], "shipped_over_fastest": rows[0]["ms"] / fastest["ms"]}


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
    p.add_argument("--tiles", action="store_true",
                   help="time the backward kernel's candidate tiles instead")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    print(f"seed {a.seed}; B {a.B} x T {a.T} x d {a.d}, width {a.W}, {a.dtype}, {device}")
    if a.tiles:
        r = tiles(a.B, a.T, a.d, a.W, dtype, device, a.repeat, a.seed)
        for row in r["rows"]:
            print(f"{row['tiles']:<45} {row['ms']:8.3f} ms {row['gbps']:8.0f} GB/s"
                  f"{'' if row['dx_equal'] else '  d x DIFFERS from the shipped tile'}")
        print(f"fastest: {r['fastest']}; the shipped tile's time / its: "
              f"{r['shipped_over_fastest']:.2f}")
        return 0 if all(row["dx_equal"] for row in r["rows"]) else 1
    r = compare(a.B, a.T, a.d, a.W, dtype, device, a.repeat, a.seed)
    print(f"torch conv1d   forward + backward {r['torch_ms']:8.3f} ms")
    print(f"causal_conv    forward + backward {r['causal_conv_ms']:8.3f} ms")
    print(f"torch conv1d time / causal_conv time: {r['speedup']:.2f} "
          "(above 1: causal_conv is faster)")
    print("largest difference, relative to the largest value: output "
          f"{r['max_rel_error'][0]:.2e}; gradients "
          + ", ".join(f"{e:.2e}" for e in r["max_rel_error"][1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
