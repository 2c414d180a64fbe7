"""What storing the matrix scan's scratch states in bf16 would cost its gradients.

The fused backward (``ten.kernels.matrix_scan_fused``) writes two buffers of chunk states,
the states entering the chunks and dL/dS leaving them, that its chunks' kernel reads: in
float32 they are most of the scan's bytes. Held in bf16 they would take half. This runs
the backward's three kernels as the scan does, once with the buffers as written and once
with them rounded to bf16 (to nearest even, what a bf16 store on a GPU does) before the
chunks' kernel reads them, and gives each gradient's error against a float64 reference
on the same inputs, as a fraction of its norm, beside the error that rounding the values
and queries to bf16 causes in the exact answer (what bf16 autocast already accepts).
Values and queries are float32 here, so that the scratch's rounding is the only one.

On CPU the kernels run in Triton's interpreter (seconds per T at these sizes); on CUDA
compiled. The eigenvalues are the model's initial range (|λ| in [0.9, 0.999], angles up
to π/10, per step and token).

    python benchmarks/bench_matrix_scratch.py                    # T 96 and 1024, seed 0
    python benchmarks/bench_matrix_scratch.py --lengths 4096 --seed 1
"""

from __future__ import annotations

import argparse
import math
import os

import torch

if not torch.cuda.is_available():  # before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ten.kernels import matrix_scan_fused as fused  # noqa: E402
from ten.kernels.matrix_scan import matrix_scan  # noqa: E402

NAMES = ("dk", "dv", "dq", "d log λ")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(T: int, heads: int, N: int, P: int, seed: int) -> list[torch.Tensor]:
    """(k, v, q, log λ) for one batch row, float64, selective (log λ per token)."""
    g = torch.Generator().manual_seed(seed)
    K = heads * N
    k = torch.randn(1, T, 2 * K, generator=g, dtype=torch.float64) / math.sqrt(N)
    v = torch.randn(1, T, heads * P, generator=g, dtype=torch.float64)
    q = torch.randn(1, T, 2 * K, generator=g, dtype=torch.float64) / math.sqrt(N)
    log_mag = torch.log(0.9 + 0.099 * torch.rand(1, T, K, generator=g, dtype=torch.float64))
    angle = math.pi / 10 * torch.rand(1, T, K, generator=g, dtype=torch.float64)
    return [k, v, q, torch.cat([log_mag, angle], dim=-1)]


def exact_grads(inputs: list[torch.Tensor], dy: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """dk, dv, dq, d log λ of Σ y·dy by the reference recurrence in float64."""
    leaves = [x.clone().requires_grad_() for x in inputs]
    y, _ = matrix_scan(*leaves, None, heads=heads, backend="ref")
    return list(torch.autograd.grad((y * dy).sum(), leaves))


def fused_grads(inputs: list[torch.Tensor], dy: torch.Tensor, heads: int,
                scratch: torch.dtype) -> list[torch.Tensor]:
    """The fused backward's gradients in float32, its two scratch buffers read in
    ``scratch`` (as stored in it: rounded once from the kernels' float32)."""
    k, v, q, ll = (x.float().to(DEVICE) for x in inputs)
    dy = dy.float().to(DEVICE)
    scores = fused._scores_impl(k, q, ll, heads)
    states = fused._states_impl(k, v, q, ll, None, heads)
    dstates, _ = fused._dstates_impl(k, q, ll, dy, None, heads)
    dk, dq, dv, within, totals = fused._backward_impl(
        k, v, q, ll, scores, states.to(scratch).float(), dstates.to(scratch).float(), dy, heads)
    _, s_end = fused._forward_impl(k, v, q, ll, None, scores, heads)
    dll = fused._log_lam_grad(within, totals, ll, k.shape[1], s_end, None)
    return [t.double().cpu() for t in (dk, dv, dq, dll)]


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[96, 1024])
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--eigenstates", type=int, default=32, help="N, per head")
    ap.add_argument("--value-dim", type=int, default=64, help="P, per head")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"seed {args.seed}; {DEVICE} ({'interpreted' if fused.INTERPRETED else 'compiled'});"
          f" heads {args.heads}, N {args.eigenstates}, P {args.value_dim}")
    print("| T | scratch | " + " | ".join(NAMES) + " |")
    print("|---|---|" + "---|" * len(NAMES))
    for T in args.lengths:
        inputs = make_inputs(T, args.heads, args.eigenstates, args.value_dim, args.seed)
        g = torch.Generator().manual_seed(args.seed + 1)
        dy = torch.randn(1, T, args.heads * args.value_dim, generator=g, dtype=torch.float64)
        exact = exact_grads(inputs, dy, args.heads)
        rows = {f"{dtype}".removeprefix("torch."): fused_grads(inputs, dy, args.heads, dtype)
                for dtype in (torch.float32, torch.bfloat16)}
        k, v, q, ll = inputs
        rounded = [k, v.bfloat16().double(), q.bfloat16().double(), ll]
        rows["none: v, q rounded to bf16"] = exact_grads(rounded, dy, args.heads)
        for name, grads in rows.items():
            errors = " | ".join(f"{relative(a, b):.1e}"
                                for a, b in zip(grads, exact, strict=True))
            print(f"| {T:,} | {name} | {errors} |")


if __name__ == "__main__":
    main()
