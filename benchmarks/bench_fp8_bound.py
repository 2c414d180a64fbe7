"""How far above its true largest value the float8 SwiGLU block's bound puts the scale of
its gradient [d a | d b], and what that costs in digits: on a trained run's blocks (and
the same blocks re-initialised), with real text the run did not train on.

    ten-runner run jobs/tiny-cpu.yaml          # leaves runs/tiny-cpu (about 2 minutes)
    python benchmarks/bench_fp8_bound.py runs/tiny-cpu /usr/share/vim/vim90/doc/options.txt

Per block: the bound's ratio to the true amax of [d a | d b] (``ten.kernels.block_fused``'s
bound, max|dz|·‖W_down‖₁·gain, without its margin; and with dy's own amax in place of
max|dz|·‖W_down‖₁, for comparison), then [d a | d b] cast to e5m2 with its own amax's
scale and with the bounded scale (margin included): the relative error of [d a | d b],
of the up projection's dx = [d a | d b]·W_up and dw = [d a | d b]ᵀx that each float8 copy
gives (float64 products of the rounded values), and the share of elements that became
zero in float8 and were not zero before. The model runs in fp32 on the CPU; only the
cast is float8's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ten  # noqa: E402
from ten.kernels.block_fused import GRAD_BOUND_MARGIN, _bounded_grad_scale, _swiglu_gain  # noqa: E402
from ten.kernels.fp8 import E5M2, float8_copy  # noqa: E402
from ten.model.mlp import MLP  # noqa: E402

SEED = 0
TOP = torch.finfo(E5M2).max


def capture(model: torch.nn.Module, ids: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Each SwiGLU block's input x, [a | b], its down weight and the loss's gradient dz at
    its output, from one forward and backward of the next-token loss."""
    blocks: list[dict[str, torch.Tensor]] = []

    def keep(mlp: MLP, inputs: tuple, z: torch.Tensor) -> None:
        x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
        entry = {"x": x, "ab": F.linear(x, mlp.up.weight).detach(),
                 "up": mlp.up.weight.detach(), "down": mlp.down.weight.detach()}
        z.register_hook(lambda g: entry.__setitem__("dz", g.reshape(-1, g.shape[-1])))
        blocks.append(entry)

    hooks = [m.register_forward_hook(keep) for m in model.modules()
             if isinstance(m, MLP) and m.kind == "swiglu"]
    try:
        logits, _ = model(ids)
        F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    finally:
        for h in hooks:
            h.remove()
    return blocks


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def measure(block: dict[str, torch.Tensor]) -> dict[str, float]:
    ab, dz, down, up, x = (block[k].double() for k in ("ab", "dz", "down", "up", "x"))
    a, b = ab.chunk(2, dim=-1)
    dy = dz @ down
    s = torch.sigmoid(a)
    dab = torch.cat([dy * b * s * (1 + a * (1 - s)), dy * a * s], dim=1)
    amax, gain = dab.abs().amax(), _swiglu_gain(block["ab"]).double()
    bounded = _bounded_grad_scale((dz.abs().amax() / TOP).float(), block["down"],
                                  gain.float()).double()
    out = {"bound_over_amax": (bounded * TOP / GRAD_BOUND_MARGIN / amax).item(),
           "dy_bound_over_amax": (dy.abs().amax() * gain / amax).item()}
    dx, dw = dab @ up, dab.t() @ x
    for name, scale in (("own", amax / TOP), ("bounded", bounded)):
        q = float8_copy(dab.float(), scale.float(), E5M2, False, 1).double() * scale
        out[f"{name}_dab"] = rel(q, dab)
        out[f"{name}_dx"] = rel(q @ up, dx)
        out[f"{name}_dw"] = rel(q.t() @ x, dw)
        out[f"{name}_flushed"] = ((q == 0) & (dab != 0)).double().mean().item()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run directory (ten-runner run leaves runs/<name>)")
    p.add_argument("text", type=Path, help="a text file the run did not train on")
    p.add_argument("--rows", type=int, default=16, help="sequences of the run's seq_len")
    p.add_argument("--seq-len", type=int, default=256)
    args = p.parse_args(argv)
    torch.manual_seed(SEED)
    print(f"seed {SEED}")
    run = ten.load_run(args.run)
    tokens = run.tokenizer.encode(args.text.read_text(errors="replace")[:400_000])
    n = args.rows * args.seq_len
    if len(tokens) < n:
        sys.exit(f"bench_fp8_bound: {args.text} gives {len(tokens)} tokens; "
                 f"--rows x --seq-len needs {n}")
    ids = torch.tensor(tokens[:n]).view(args.rows, args.seq_len)
    trained = run.model.float().train()
    fresh = type(trained)(trained.config).float().train()
    print("| model | block | bound / amax | with dy's amax | error of [da|db]: own / bounded "
          "| of dx | of dw | flushed to 0 |")
    print("|---|---|---|---|---|---|---|---|")
    for label, model in ((f"trained, step {run.step}", trained), ("initialised", fresh)):
        for i, block in enumerate(capture(model, ids)):
            m = measure(block)
            print(f"| {label} | {i} | {m['bound_over_amax']:.1f}x | "
                  f"{m['dy_bound_over_amax']:.1f}x | {m['own_dab']:.4f} / {m['bounded_dab']:.4f} "
                  f"| {m['own_dx']:.4f} / {m['bounded_dx']:.4f} "
                  f"| {m['own_dw']:.4f} / {m['bounded_dw']:.4f} "
                  f"| {m['own_flushed']:.4f} / {m['bounded_flushed']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
