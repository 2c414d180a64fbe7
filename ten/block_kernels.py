"""Triton kernels for ``ten.block_fused``'s operators (registered there for CUDA): the
LayerNorm forward and backward, SwiGLU forward and backward. Each launcher has the
signature of the operator's torch implementation. One program per row (LayerNorm; ROWS
rows per program in backward, whose partial weight gradients torch then sums) or per row
and block of columns (SwiGLU); loops over a runtime count are while loops (Triton 3.6's
interpreter takes no runtime bound in range()).

Arithmetic is in ``ACC``: fp32 for bf16, fp16 and fp32 tensors, fp64 for fp64 ones (a
float64 model, and the gradient checks, stay exact on the GPU as on the CPU)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["acc", "compute_dtype", "layer_norm", "layer_norm_backward", "swiglu", "swiglu_backward"]


@triton.jit
def _ln_forward_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, d, eps,
                       BD: tl.constexpr, ACC: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.arange(0, BD)
    mask = cols < d
    x = tl.load(x_ptr + r.to(tl.int64) * d + cols, mask=mask, other=0.0).to(ACC)
    mean = tl.sum(x, axis=0) / d
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / d + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(ACC)
    y = xc * rstd * w + b
    tl.store(y_ptr + r.to(tl.int64) * d + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + r, mean)
    tl.store(rstd_ptr + r, rstd)


@triton.jit
def _ln_backward_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,
                        n, d, ROWS: tl.constexpr, BD: tl.constexpr, ACC: tl.constexpr):
    """ROWS rows per program; its partial d weight and d bias go to row ``pid``."""
    p = tl.program_id(0)
    cols = tl.arange(0, BD)
    mask = cols < d
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
    dw = tl.zeros((BD,), ACC)
    db = tl.zeros((BD,), ACC)
    for i in range(0, ROWS):  # a constexpr bound: fine for every interpreter
        r = p * ROWS + i
        if r < n:
            off = r.to(tl.int64) * d + cols
            x = tl.load(x_ptr + off, mask=mask, other=0.0).to(ACC)
            g = tl.load(dy_ptr + off, mask=mask, other=0.0).to(ACC)
            mean = tl.load(mean_ptr + r).to(ACC)
            rstd = tl.load(rstd_ptr + r).to(ACC)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            gw = g * w
            c1 = tl.sum(gw, axis=0) / d
            c2 = tl.sum(gw * xhat, axis=0) / d
            dx = rstd * (gw - c1 - xhat * c2)
            tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw += g * xhat
            db += g
    tl.store(dw_ptr + p.to(tl.int64) * d + cols, dw, mask=mask)
    tl.store(db_ptr + p.to(tl.int64) * d + cols, db, mask=mask)


@triton.jit
def _swiglu_halves(ab_ptr, h, BH: tl.constexpr, ACC: tl.constexpr):
    """This program's row and columns of ab = [a | b], and a and b there in ACC."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    mask = cols < h
    a = tl.load(ab_ptr + row * 2 * h + cols, mask=mask, other=0.0).to(ACC)
    b = tl.load(ab_ptr + row * 2 * h + h + cols, mask=mask, other=0.0).to(ACC)
    return row, cols, mask, a, b


@triton.jit
def _swiglu_forward_kernel(ab_ptr, y_ptr, h, BH: tl.constexpr, ACC: tl.constexpr):
    row, cols, mask, a, b = _swiglu_halves(ab_ptr, h, BH, ACC)
    y = a * tl.sigmoid(a) * b
    tl.store(y_ptr + row * h + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_backward_kernel(dy_ptr, ab_ptr, dab_ptr, h, BH: tl.constexpr, ACC: tl.constexpr):
    row, cols, mask, a, b = _swiglu_halves(ab_ptr, h, BH, ACC)
    g = tl.load(dy_ptr + row * h + cols, mask=mask, other=0.0).to(ACC)
    s = tl.sigmoid(a)
    da = g * b * s * (1.0 + a * (1.0 - s))
    db = g * a * s
    tl.store(dab_ptr + row * 2 * h + cols, da.to(dab_ptr.dtype.element_ty), mask=mask)
    tl.store(dab_ptr + row * 2 * h + h + cols, db.to(dab_ptr.dtype.element_ty), mask=mask)

LN_ROWS = 16  # rows per backward program: partial weight gradients are n / 16 rows


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """What a kernel computes in for these tensors: fp32, or fp64 if any is fp64."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def acc(*tensors: Tensor) -> tl.dtype:
    """compute_dtype as the kernels' ``ACC`` constexpr."""
    return tl.float64 if compute_dtype(*tensors) == torch.float64 else tl.float32


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float,
               out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    n, d = x.shape
    y = x.new_empty((n, d), dtype=out_dtype)
    stats = torch.promote_types(x.dtype, torch.float32)  # as the operator's torch version
    mean, rstd = x.new_empty(n, dtype=stats), x.new_empty(n, dtype=stats)
    if n:
        _ln_forward_kernel[(n,)](x, weight, bias, y, mean, rstd, d, eps,
                                 BD=triton.next_power_of_2(d), ACC=acc(x, weight, bias),
                                 num_warps=4)
    return y, mean, rstd


def layer_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor,
                        rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    n, d = x.shape
    programs = max(1, triton.cdiv(n, LN_ROWS))
    dx = torch.empty_like(x)
    dw = x.new_zeros((programs, d), dtype=compute_dtype(dy, x, weight))
    db = torch.zeros_like(dw)
    if n:
        _ln_backward_kernel[(programs,)](dy, x, weight, mean, rstd, dx, dw, db, n, d,
                                         ROWS=LN_ROWS, BD=triton.next_power_of_2(d),
                                         ACC=acc(dy, x, weight), num_warps=4)
    return dx, dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype)


def _swiglu_cut(ab: Tensor) -> tuple[int, int, int]:
    """(rows, H, columns per program) of ab (..., 2H)."""
    h = ab.shape[-1] // 2
    return (ab.numel() // (2 * h) if h else 0), h, min(1024, triton.next_power_of_2(max(h, 1)))


def swiglu(ab: Tensor) -> Tensor:
    rows, h, bh = _swiglu_cut(ab)
    y = ab.new_empty(*ab.shape[:-1], h)
    if rows:
        _swiglu_forward_kernel[(rows, triton.cdiv(h, bh))](ab, y, h, BH=bh, ACC=acc(ab),
                                                           num_warps=4)
    return y


def swiglu_backward(dy: Tensor, ab: Tensor) -> Tensor:
    rows, h, bh = _swiglu_cut(ab)
    dab = torch.empty_like(ab)
    if rows:
        _swiglu_backward_kernel[(rows, triton.cdiv(h, bh))](dy, ab, dab, h, BH=bh,
                                                            ACC=acc(dy, ab), num_warps=4)
    return dab
