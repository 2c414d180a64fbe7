"""A linear layer's three GEMMs in float8, with the scales computed from each tensor as it
comes (dynamic scaling): what the L40S's and the H100's FP8 tensor cores run at twice
their bf16 rate.

``fp8_linear(x, weight, bias, scaling)`` is ``F.linear`` with

* forward ``y = x wᵀ``: x and w cast to e4m3 (3 mantissa bits, max 448);
* backward ``dx = dy w`` and ``dw = dyᵀ x``: the output's gradient cast to e5m2 (2 mantissa
  bits, max 57344: gradients span more decades than they need digits), each times the
  e4m3 operand it meets; dw comes out in float32 (the master weights').

A tensor is scaled so its largest magnitude lands on its format's largest value, then
rounded: ``scaling="tensor"`` takes one scale per tensor (one amax reduction each,
cheap; an outlier token costs every token its digits), ``"row"`` one per row of each
GEMM's operands along the summed dimension (an outlier costs its own row only; each
operand is cast again for its other GEMM, from the high-precision tensor kept for
backward). torch's ``_scaled_mm`` multiplies, accumulating in fp32, and applies the
scales to the result. Which wins on a card is measured (benchmarks/bench_fp8.py).

``_scaled_mm`` on CUDA takes its first operand row-major and its second column-major,
inner and output widths that are multiples of 16, at least one e4m3 operand, and, with
row scales, a bf16 output; ``_mm`` holds every call to that on any device, so the tests
on a CPU keep the contract a GPU enforces. A layer whose widths are not multiples of 16
is not FP8's to run: :func:`fp8_eligible`.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

E4M3 = torch.float8_e4m3fn  # what is multiplied forward: inputs and weights
E5M2 = torch.float8_e5m2  # the gradients that flow back
SCALINGS = ("tensor", "row")
Scaling = Literal["tensor", "row"]
ALIGN = 16  # _scaled_mm's widths on CUDA
_TINY = 1e-12  # an all-zero tensor's amax: its scale stays finite (and its values zero)


def fp8_eligible(in_features: int, out_features: int) -> bool:
    """Whether a linear layer of these widths can run its GEMMs in float8: both widths a
    multiple of 16 (each is the summed or the output width of one of its three GEMMs)."""
    return in_features % ALIGN == 0 and out_features % ALIGN == 0


def to_fp8(t: Tensor, dtype: torch.dtype, dim: int | None = None) -> tuple[Tensor, Tensor]:
    """(t in ``dtype``, the fp32 scale that takes it back: t ≈ t8 · scale). One scale for
    the tensor (``dim`` None), or one per slice along ``dim`` kept as a size-1 dimension
    (dim 1 of an (M, K) tensor: a scale per row, (M, 1))."""
    t = t.float()
    amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    top = torch.finfo(dtype).max
    scale = amax.clamp_min(_TINY) / top
    return (t / scale).clamp(-top, top).to(dtype), scale


def _mm(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor,
        out_dtype: torch.dtype) -> Tensor:
    """a (M, K) @ b (K, N) in float8, scaled back, in ``out_dtype``; refuses (ValueError)
    what CUDA's ``_scaled_mm`` would."""
    (M, K), (K2, N) = a.shape, b.shape
    problems = []
    if K != K2:
        problems.append(f"inner widths {K} and {K2}")
    if K % ALIGN or N % ALIGN:
        problems.append(f"widths K={K}, N={N} not multiples of {ALIGN}")
    if not a.is_contiguous() or not b.t().is_contiguous():
        problems.append("the first operand must be row-major, the second column-major")
    if a.dtype == E5M2 and b.dtype == E5M2:
        problems.append("two e5m2 operands")
    if scale_a.numel() > 1 and out_dtype != torch.bfloat16:
        problems.append("row scales give a bf16 output only")
    if problems:
        raise ValueError(f"fp8 matmul of {(M, K)} by {(K2, N)}: " + "; ".join(problems))
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)


def _column_major(t: Tensor) -> Tensor:
    """t (K, N) with the same values laid out column by column."""
    return t.t().contiguous().t()


def _rows_to_align(t: Tensor) -> Tensor:
    """t (M, ·) with zero rows after it up to a multiple of 16: dw sums over the rows
    (tokens), a width CUDA wants aligned; zero rows add nothing to it."""
    extra = -t.shape[0] % ALIGN
    return F.pad(t, (0, 0, 0, extra)) if extra else t


class _FP8Linear(torch.autograd.Function):
    """y = x wᵀ with float8 GEMMs each way (see the module's docstring). Keeps for
    backward the float8 casts (tensor scaling: half of bf16's bytes) or the tensors
    themselves (row scaling casts them again along the other dimension). The rows (x's
    and dy's) are padded with zeros to a multiple of 16 before their casts: dw sums over
    them, a width CUDA wants aligned, and zero rows add nothing (nor change an amax)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, out_dtype: torch.dtype, scaling: str) -> Tensor:
        M, row = x.shape[0], scaling == "row"
        x = _rows_to_align(x)
        x8, sx = to_fp8(x, E4M3, 1 if row else None)  # (M, 1) or ()
        w8, sw = to_fp8(w, E4M3, 1 if row else None)  # (N, 1) or ()
        y = _mm(x8[:M], w8.t(), sx[:M] if row else sx, sw.t() if row else sw,
                torch.bfloat16 if row else out_dtype).to(out_dtype)
        ctx.scaling, ctx.rows, ctx.w_dtype = scaling, M, w.dtype
        ctx.save_for_backward(*((x, w) if row else (x8, sx, w8, sw)))
        return y

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, None, None]:
        M = ctx.rows
        dy = _rows_to_align(dy.contiguous())
        if ctx.scaling == "row":
            x, w = ctx.saved_tensors
            g8, sg = to_fp8(dy, E5M2, 1)  # dx's rows: dy's rows (M, 1)
            wc8, swc = to_fp8(w, E4M3, 0)  # dx's columns: w's columns (1, K)
            dx = _mm(g8[:M], _column_major(wc8), sg[:M], swc, torch.bfloat16)
            gt8, sgt = to_fp8(dy.t(), E5M2, 1)  # dw's rows: dy's columns (N, 1)
            xc8, sxc = to_fp8(x, E4M3, 0)  # dw's columns: x's columns (1, K)
            dw = _mm(gt8.contiguous(), _column_major(xc8), sgt, sxc, torch.bfloat16)
        else:
            x8, sx, w8, sw = ctx.saved_tensors
            g8, sg = to_fp8(dy, E5M2)
            dx = _mm(g8[:M], _column_major(w8), sg, sw, dy.dtype)
            dw = _mm(g8.t().contiguous(), _column_major(x8), sg, sx, torch.float32)
        return dx.to(dy.dtype), dw.to(ctx.w_dtype), None, None


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
               scaling: Scaling = "tensor") -> Tensor:
    """``F.linear(x, weight, bias)`` with its GEMMs in float8 (forward and backward), in
    the autocast dtype where autocast is on (as F.linear would be), else x's. weight
    (N, K) with N and K multiples of 16 (:func:`fp8_eligible`); x (..., K), any number
    of rows."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    N, K = weight.shape
    if not fp8_eligible(K, N):
        raise ValueError(f"fp8_linear needs widths that are multiples of {ALIGN}, "
                         f"got a ({N}, {K}) weight")
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    with torch.autocast(dev, enabled=False):  # the casts are this function's own
        y = _FP8Linear.apply(x.reshape(-1, K).contiguous(), weight, out_dtype, scaling)
        y = y.view(*x.shape[:-1], N)
        return y if bias is None else y + bias.to(out_dtype)


def reference_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """What fp8_linear approximates: F.linear in x's dtype (float64 in the tests)."""
    return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
