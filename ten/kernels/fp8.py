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
GEMM's operands along the summed dimension (an outlier costs its own row only). Each
GEMM casts its own operands from the high-precision tensors a layer keeps for backward
(as F.linear keeps x and w): no more memory than bf16, an amax and a cast more per
operand. torch's ``_scaled_mm`` multiplies, accumulating in fp32, and applies the scales
to the result. Which wins on a card is measured (benchmarks/bench_fp8.py).

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

from ten.config import FP8_ALIGN, FP8_SCALINGS

E4M3 = torch.float8_e4m3fn  # what is multiplied forward: inputs and weights
E5M2 = torch.float8_e5m2  # the gradients that flow back
SCALINGS = FP8_SCALINGS  # declared with the model's fields (ten.config)
Scaling = Literal["tensor", "row"]
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (L40S, sm_89) and Hopper (H100, sm_90)
ALIGN = FP8_ALIGN  # _scaled_mm's widths on CUDA (the model config checks them too)
_TINY = 1e-12  # an all-zero tensor's amax: its scale stays finite (and its values zero)


class FP8Error(ValueError):
    """Float8 GEMMs asked of a device without FP8 tensor cores."""


def check_device(device: torch.device, setting: str = "TENConfig.fp8") -> None:
    """FP8Error, naming ``setting`` (the model config's field) and what to set it to,
    unless ``device`` is a GPU with FP8 tensor cores (a CPU runs _scaled_mm only as a
    slow emulation: for tests, not runs)."""
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap >= MIN_CAPABILITY:
            return
        where = f"{torch.cuda.get_device_name(device)} (compute capability {cap[0]}.{cap[1]})"
    else:
        where = f"the {device.type}"
    raise FP8Error(f"{setting} runs float8 GEMMs on a GPU with FP8 tensor cores (compute "
                   f"capability 8.9+: L40S, H100); this run is on {where}: set {setting} "
                   "to off")


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
    (tokens), a width CUDA wants aligned; zero rows add nothing to it, nor to an amax."""
    extra = -t.shape[0] % ALIGN
    return F.pad(t, (0, 0, 0, extra)) if extra else t


class Float8Gemms:
    """The three GEMMs of y = x wᵀ (x (M, K), w (N, K)) in float8, each casting its
    high-precision operands with scales of ``scaling``: what a layer that keeps x and w
    for backward (as F.linear's autograd keeps them) calls in place of torch's matmuls."""

    def __init__(self, scaling: Scaling = "tensor"):
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
        self.scaling = scaling
        self._row = scaling == "row"

    def forward(self, x: Tensor, w: Tensor, out_dtype: torch.dtype) -> Tensor:
        """y = x wᵀ (M, N) in ``out_dtype``: x by its rows, w by its rows (y's columns)."""
        dim = 1 if self._row else None
        x8, sx = to_fp8(x, E4M3, dim)  # (M, 1) or ()
        w8, sw = to_fp8(w, E4M3, dim)  # (N, 1) or ()
        return _mm(x8, w8.t(), sx, sw.t() if self._row else sw,
                   torch.bfloat16 if self._row else out_dtype).to(out_dtype)

    def grad_input(self, dy: Tensor, w: Tensor) -> Tensor:
        """dx = dy w (M, K) in dy's dtype: dy by its rows, w by its columns."""
        g8, sg = to_fp8(dy, E5M2, 1 if self._row else None)  # (M, 1) or ()
        w8, sw = to_fp8(w, E4M3, 0 if self._row else None)  # (1, K) or ()
        return _mm(g8, _column_major(w8), sg, sw,
                   torch.bfloat16 if self._row else dy.dtype).to(dy.dtype)

    def grad_weight(self, dy: Tensor, x: Tensor) -> Tensor:
        """dw = dyᵀ x (N, K) in float32: dyᵀ by its rows (dy's columns), x by its columns,
        both with zero rows up to a multiple of 16 (the sum runs over them)."""
        dy, x = _rows_to_align(dy), _rows_to_align(x)
        g8, sg = to_fp8(dy.t(), E5M2, 1 if self._row else None)  # (N, 1) or ()
        x8, sx = to_fp8(x, E4M3, 0 if self._row else None)  # (1, K) or ()
        return _mm(g8.contiguous(), _column_major(x8), sg, sx,
                   torch.bfloat16 if self._row else torch.float32).float()


class _FP8Linear(torch.autograd.Function):
    """y = x wᵀ with float8 GEMMs each way (:class:`Float8Gemms`), keeping x and w for
    backward as F.linear does."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, out_dtype: torch.dtype,
                gemms: Float8Gemms) -> Tensor:
        ctx.gemms = gemms
        ctx.save_for_backward(x, w)
        return gemms.forward(x, w, out_dtype)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, None, None]:
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        return (ctx.gemms.grad_input(dy, w).to(x.dtype),
                ctx.gemms.grad_weight(dy, x).to(w.dtype), None, None)


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
               scaling: Scaling = "tensor") -> Tensor:
    """``F.linear(x, weight, bias)`` with its GEMMs in float8 (forward and backward), in
    the autocast dtype where autocast is on (as F.linear would be), else x's; x is kept
    for backward in that dtype too, as autocast's F.linear keeps its cast. weight (N, K)
    with N and K multiples of 16 (:func:`fp8_eligible`); x (..., K), any number of rows."""
    gemms = Float8Gemms(scaling)
    N, K = weight.shape
    if not fp8_eligible(K, N):
        raise ValueError(f"fp8_linear needs widths that are multiples of {ALIGN}, "
                         f"got a ({N}, {K}) weight")
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    with torch.autocast(dev, enabled=False):  # the casts are this function's own
        rows = x.reshape(-1, K).to(out_dtype).contiguous()
        y = _FP8Linear.apply(rows, weight, out_dtype, gemms)
        y = y.view(*x.shape[:-1], N)
        return y if bias is None else y + bias.to(out_dtype)


def reference_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """What fp8_linear approximates: F.linear in x's dtype (float64 in the tests)."""
    return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
