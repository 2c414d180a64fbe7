"""The flagship's linear layers, forward + backward, in bf16 (``F.linear`` under autocast)
against float8 (``ten.kernels.fp8.fp8_linear``) with one scale a tensor and one a row, on
the same inputs: the time of each, the ratio to bf16, and each float8 result's error
against float64 (the relative norm of the output's and of both gradients' differences):

    python benchmarks/bench_fp8.py --device cuda            # 32,768 tokens, small_32k's layers
    python benchmarks/bench_fp8.py --device cpu --tokens 256 --smoke   # runs; times nothing

The layers are small_32k's (d 1024, K 128, SwiGLU 2752): the MLP's two projections
(~84% of a block's linear FLOPs), the gate, the drive (W_in and W_Δ stacked) and W_out.
float8 pays for its casts (an amax and a scaled copy of each operand, per GEMM) out of
the GEMMs' halved time: which layers gain, and by how much, is what this measures.
Times are medians of ``--repeat`` runs after three warm-ups, synchronised on CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import median_ms  # noqa: E402

from ten.kernels.fp8 import SCALINGS, fp8_linear, reference_linear  # noqa: E402
from ten.model.presets import model_config  # noqa: E402

SEED = 0


def flagship_layers(shrink: int = 1) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer of a small_32k block (each width divided by
    ``shrink``, kept a multiple of 16)."""
    c = model_config("ten", "small_32k")
    d, K, H = c.d_model, c.n_eigenstates, c.mlp_hidden
    layers = {"mlp up": (d, 2 * H), "mlp down": (H, d), "gate": (d, d),
              "drive": (d, 2 * K + K), "out": (2 * K, d)}
    return {k: tuple(max(16, n // shrink // 16 * 16) for n in v) for k, v in layers.items()}


def measure(n_in: int, n_out: int, tokens: int, device: torch.device,
            repeat: int) -> dict[str, dict[str, float]]:
    """bf16 and each float8 scaling on one layer: ms forward + backward, and the errors;
    a variant the card refuses (torch's row scaling wants an sm_90 on some releases) is
    {"error": torch's first line}, the others still measured."""
    g = torch.Generator(device="cpu").manual_seed(SEED)
    x = torch.randn(tokens, n_in, generator=g).to(device).bfloat16().requires_grad_()
    w = (torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(device).requires_grad_()
    dy = torch.randn(tokens, n_out, generator=g).to(device).bfloat16()
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    reference_linear(xd, wd).backward(dy.double())

    def run(linear):
        def once():
            x.grad = w.grad = None
            with torch.autocast(device.type, dtype=torch.bfloat16):
                y = linear(x, w)
            y.backward(dy)
            return y
        return once

    def errors(y):  # of y, dx, dw
        return [((a.double() - b).norm() / b.norm()).item()
                for a, b in ((y, reference_linear(xd, wd)), (x.grad, xd.grad),
                             (w.grad, wd.grad))]

    out = {}
    for name, linear in [("bf16", torch.nn.functional.linear),
                         *((f"fp8 {s}", lambda a, b, s=s: fp8_linear(a, b, scaling=s))
                           for s in SCALINGS)]:
        once = run(linear)
        try:
            out[name] = {"ms": median_ms(once, device, repeat),
                         "errors": errors(once().detach())}
        except RuntimeError as e:
            out[name] = {"error": str(e).strip().splitlines()[0][:200]}
    for row in out.values():
        if "ms" in row and "ms" in out["bf16"]:
            row["speedup"] = out["bf16"]["ms"] / row["ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--smoke", action="store_true",
                   help="a rehearsal: the widths / 16, 1 repeat (bf16 on a CPU is emulated)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    repeat = 1 if args.smoke else args.repeat
    print(f"seed {SEED}; {args.tokens} tokens on {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    rows = {}
    print(f"{'layer':10} {'in x out':>12} {'bf16 ms':>8} {'fp8 tensor':>18} {'fp8 row':>18}")
    total = {name: 0.0 for name in ("bf16", *(f"fp8 {s}" for s in SCALINGS))}
    for layer, (n_in, n_out) in flagship_layers(16 if args.smoke else 1).items():
        r = rows[layer] = measure(n_in, n_out, args.tokens, device, repeat)
        for name in total:
            total[name] += r[name].get("ms", math.nan)
        cells = [f"{r[k]['ms']:7.3f} ({r[k]['speedup']:.2f}x)" if "ms" in r[k] else "refused"
                 for k in total]
        print(f"{layer:10} {f'{n_in}x{n_out}':>12} {cells[0].split()[0]:>8} "
              + " ".join(f"{c:>18}" for c in cells[1:])
              + "   errors (y, dx, dw) " + "  ".join(
                  "/".join(f"{e:.3f}" for e in r[k]["errors"]) if "errors" in r[k] else "-"
                  for k in total))
        for k in total:
            if "error" in r[k]:
                print(f"  {k}: {r[k]['error']}")
    print("all layers: " + ", ".join(f"{k} {total['bf16'] / v:.2f}x bf16's speed"
                                     for k, v in total.items() if k != "bf16"))
    if args.json:
        args.json.write_text(json.dumps({"device": str(device), "tokens": args.tokens,
                                         "layers": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
