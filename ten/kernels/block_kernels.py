"""Triton kernels for ``ten.kernels.block_fused``'s operators (registered there for CUDA): the
LayerNorm (alone, or of a residual sum it writes, whose second term may be gated by a
sigmoid), SwiGLU and the causal convolution, each forward and backward. Each launcher has
the signature of the operator's torch implementation. One program per row (LayerNorm; ROWS
rows per program in backward, whose partial weight gradients torch then sums), per row and
block of columns (SwiGLU), or per tile of tokens and channels of one sequence (the
convolution, whose backward writes weight-gradient shares torch sums); loops over a
runtime count are while loops (Triton 3.6's interpreter takes no runtime bound in
range()). For the float8 SwiGLU block (ten.kernels.fp8, one scale a tensor) the
LayerNorm before it and the SwiGLU forward with AMAX also store each program's largest
magnitude of what they wrote, so the output's scale is reduced from one float a program,
not from another pass over the output (the SwiGLU forward the largest gain of its
backward too, which bounds the gradient's scale); the float8 backward (tiles of tokens
and columns) writes its GEMMs' operands in float8 as they read them: [d a | d b] by its
rows and transposed, and the product transposed, where the plain backward writes both
in bf16.

Arithmetic is in ``ACC``: fp32 for bf16, fp16 and fp32 tensors, fp64 for fp64 ones (a
float64 model, and the gradient checks, stay exact on the GPU as on the CPU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from ten.kernels.fp8_kernels import FORMATS, fp8_scale, max_nan, quantize

__all__ = ["acc", "add_layer_norm", "add_layer_norm_backward", "add_layer_norm_with_scale",
           "causal_conv", "causal_conv_backward", "compute_dtype", "layer_norm",
           "layer_norm_backward", "swiglu", "swiglu_backward", "swiglu_backward_float8",
           "swiglu_with_scale"]


@triton.jit
def _ln_forward_kernel(x_ptr, r_ptr, g_ptr, h_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
                       part_ptr, d, eps, BD: tl.constexpr, ACC: tl.constexpr,
                       ADD: tl.constexpr, GATE: tl.constexpr, AMAX: tl.constexpr):
    """One row: y = LN(x); with ADD, of h = x + r, which it writes too (the residual
    stream and its norm in one pass); with GATE too, of h = x + σ(g)·r, the product
    rounded to r's dtype (as a gate of its own would store it); with AMAX, the row's largest
    |y| as stored, into part (a float8 scale of y is reduced from those)."""
    r = tl.program_id(0)
    cols = tl.arange(0, BD)
    mask = cols < d
    off = r.to(tl.int64) * d + cols
    x = tl.load(x_ptr + off, mask=mask, other=0.0).to(ACC)
    if ADD:
        rv = tl.load(r_ptr + off, mask=mask, other=0.0).to(ACC)
        if GATE:
            g = tl.load(g_ptr + off, mask=mask, other=0.0).to(ACC)
            rv = (tl.sigmoid(g) * rv).to(r_ptr.dtype.element_ty).to(ACC)
        h = (x + rv).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + off, h, mask=mask)
        x = h.to(ACC)  # the statistics of h as stored, as torch's norm of it
    mean = tl.sum(x, axis=0) / d
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / d + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(ACC)
    y = (xc * rstd * w + b).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + off, y, mask=mask)
    if AMAX:  # masked lanes hold 0 · rstd · 0 + 0
        tl.store(part_ptr + r, tl.reduce(tl.abs(y.to(tl.float32)), 0, max_nan))
    tl.store(mean_ptr + r, mean)
    tl.store(rstd_ptr + r, rstd)


@triton.jit
def _ln_backward_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dh_ptr, dx_ptr, dr_ptr,
                        r_ptr, g_ptr, dg_ptr, dw_ptr, db_ptr, n, d, ROWS: tl.constexpr,
                        BD: tl.constexpr, ACC: tl.constexpr, DH: tl.constexpr,
                        DR: tl.constexpr, GATE: tl.constexpr):
    """ROWS rows per program; its partial d weight and d bias go to row ``pid``. With DH,
    the residual stream's own gradient dh is added to dx (the norm of a sum: both of the
    sum's inputs get dx); with DR, dx is written a second time in dr's dtype; with GATE
    (the sum was x + σ(g)·r), dr and dg are the gate's gradients of the stored dx in r's
    dtype, in ACC, each rounded once."""
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
            if DH:
                dx = dx.to(dx_ptr.dtype.element_ty).to(ACC)  # torch adds the rounded grads
                dx += tl.load(dh_ptr + off, mask=mask, other=0.0).to(ACC)
            tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if GATE:  # σ(g)·r's gradient: dx as stored, in r's dtype, as autograd's
                dxs = dx.to(dx_ptr.dtype.element_ty).to(dr_ptr.dtype.element_ty).to(ACC)
                o = tl.load(r_ptr + off, mask=mask, other=0.0).to(ACC)
                s = tl.sigmoid(tl.load(g_ptr + off, mask=mask, other=0.0).to(ACC))
                tl.store(dg_ptr + off, (dxs * o * (1.0 - s) * s).to(dg_ptr.dtype.element_ty),
                         mask=mask)
                tl.store(dr_ptr + off, (dxs * s).to(dr_ptr.dtype.element_ty), mask=mask)
            elif DR:
                tl.store(dr_ptr + off, dx.to(dx_ptr.dtype.element_ty).to(dr_ptr.dtype.element_ty),
                         mask=mask)
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
def _partial_amax(part_ptr, magnitude):
    """This program's largest ``magnitude`` (NaN wins, as in torch's amax), stored at its
    place in the (rows, column blocks) partial maxima a float8 scale is reduced from."""
    p = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
    tl.store(part_ptr + p, tl.reduce(magnitude, 0, max_nan))


@triton.jit
def _swiglu_forward_kernel(ab_ptr, y_ptr, part_ptr, h, BH: tl.constexpr, ACC: tl.constexpr,
                           AMAX: tl.constexpr):
    """y = silu(a)·b; with AMAX, this program's largest |y| as stored into part's first
    half, and its largest gain max(|b·silu'(a)|, |silu(a)|) (what the backward multiplies
    dy by) into its second."""
    row, cols, mask, a, b = _swiglu_halves(ab_ptr, h, BH, ACC)
    s = tl.sigmoid(a)
    y = (a * s * b).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * h + cols, y, mask=mask)
    if AMAX:  # masked lanes hold silu(0)·0 = 0, and gains of 0
        _partial_amax(part_ptr, tl.abs(y.to(tl.float32)))
        gain = max_nan(tl.abs(b * s * (1.0 + a * (1.0 - s))), tl.abs(a * s)).to(tl.float32)
        _partial_amax(part_ptr + tl.num_programs(0) * tl.num_programs(1), gain)


@triton.jit
def _swiglu_backward_kernel(dy_ptr, ab_ptr, dab_ptr, h, BH: tl.constexpr, ACC: tl.constexpr):
    row, cols, mask, a, b = _swiglu_halves(ab_ptr, h, BH, ACC)
    g = tl.load(dy_ptr + row * h + cols, mask=mask, other=0.0).to(ACC)
    s = tl.sigmoid(a)
    da = g * b * s * (1.0 + a * (1.0 - s))
    db = g * a * s
    tl.store(dab_ptr + row * 2 * h + cols, da.to(dab_ptr.dtype.element_ty), mask=mask)
    tl.store(dab_ptr + row * 2 * h + h + cols, db.to(dab_ptr.dtype.element_ty), mask=mask)
    y = a * s * b  # the forward's product, its operations in its order: the same bits
    # over dy, which this program has read
    tl.store(dy_ptr + row * h + cols, y.to(dy_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _inverse(scale_ptr):
    """The reciprocal of the one scale at scale_ptr, IEEE's, as a (1, 1) tile."""
    return tl.math.div_rn(tl.full((1, 1), 1.0, tl.float32),
                          tl.load(scale_ptr + tl.zeros((1, 1), tl.int32)))


@triton.jit
def _swiglu_backward_float8_kernel(dy_ptr, ab_ptr, dab8_ptr, dab8_t_ptr, grad_scale_ptr,
                                   y_scale_ptr, y8_t_ptr, M, Mp, h, G8: tl.constexpr,
                                   G_TOP: tl.constexpr, G_MANT: tl.constexpr,
                                   G_EMIN: tl.constexpr, Y8: tl.constexpr,
                                   Y_TOP: tl.constexpr, Y_MANT: tl.constexpr,
                                   Y_EMIN: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """On a BR x BC tile of tokens and columns: [d a | d b] for y = silu(a)·b, rounded to
    ab's dtype, then in float8 (G8) with grad_scale, written by its rows into dab8 (Mp, 2H)
    and transposed into dab8_t (2H, Mp) for the up projection's two GEMMs; and y as
    forward stored it, in float8 (Y8) with forward's scale, transposed into y8_t (H, Mp)
    for the down projection's weight gradient. Rows M to Mp are zeros (their a and b read
    as zeros)."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    cols = (tl.program_id(1) * BC + tl.arange(0, BC)).to(tl.int64)  # cols * Mp: past 2^31
    inside = (rows[:, None] < M) & (cols[None, :] < h)
    at = rows[:, None] * 2 * h + cols[None, :]
    a = tl.load(ab_ptr + at, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(ab_ptr + at + h, mask=inside, other=0.0).to(tl.float32)
    g = tl.load(dy_ptr + rows[:, None] * h + cols[None, :], mask=inside,
                other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    ab_dtype = ab_ptr.dtype.element_ty
    da = (g * b * s * (1.0 + a * (1.0 - s))).to(ab_dtype).to(tl.float32)
    db = (g * a * s).to(ab_dtype).to(tl.float32)
    stored = (rows[:, None] < Mp) & (cols[None, :] < h)
    inverse = _inverse(grad_scale_ptr)
    da8 = quantize(da, inverse, G_TOP, G_MANT, G_EMIN).to(G8)
    db8 = quantize(db, inverse, G_TOP, G_MANT, G_EMIN).to(G8)
    tl.store(dab8_ptr + at, da8, mask=stored)
    tl.store(dab8_ptr + at + h, db8, mask=stored)
    at_t = cols[None, :] * Mp + rows[:, None]
    tl.store(dab8_t_ptr + at_t, da8, mask=stored)
    tl.store(dab8_t_ptr + at_t + h * Mp, db8, mask=stored)
    y = (a * s * b).to(ab_dtype).to(tl.float32)  # forward's, as it stored it
    tl.store(y8_t_ptr + at_t, quantize(y, _inverse(y_scale_ptr), Y_TOP, Y_MANT, Y_EMIN).to(Y8),
             mask=stored)


@triton.jit
def _conv_rows(x_ptr, tail_ptr, b, p, c, mask, T, d, W: tl.constexpr, TAIL: tl.constexpr,
               ACC: tl.constexpr):
    """Rows p of xp = [tail | x] of sequence b (at channels c, where mask): x's rows from
    p = W - 1 on; before them the tail's with TAIL, else zeros (a sequence's start)."""
    v = tl.load(x_ptr + (b * T + p - (W - 1)) * d + c, mask=mask & (p >= W - 1),
                other=0.0).to(ACC)
    if TAIL:
        v += tl.load(tail_ptr + (b * (W - 1) + p) * d + c, mask=mask & (p < W - 1),
                     other=0.0).to(ACC)
    return v


@triton.jit
def _conv_store_rows(dx_ptr, dtail_ptr, v, b, p, c, mask, T, d, W: tl.constexpr,
                     TAIL: tl.constexpr):
    """``v`` to rows p of d xp = [d tail | d x] (the inverse of :func:`_conv_rows`; the
    zeros before a sequence's start get no gradient)."""
    tl.store(dx_ptr + (b * T + p - (W - 1)) * d + c, v.to(dx_ptr.dtype.element_ty),
             mask=mask & (p >= W - 1))
    if TAIL:
        tl.store(dtail_ptr + (b * (W - 1) + p) * d + c, v.to(dtail_ptr.dtype.element_ty),
                 mask=mask & (p < W - 1))


@triton.jit
def _conv_forward_kernel(x_ptr, tail_ptr, w_ptr, b_ptr, y_ptr, T, d, W: tl.constexpr,
                         TAIL: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                         ACC: tl.constexpr):
    """y[b, t] = bias + Σ_j w[:, j]·xp[b, t + j] on this program's (BT, BD) tile of row b,
    where xp is W - 1 rows (the tail's, the inputs before x, with TAIL; else zeros) then
    x's T rows, each read where it is (no copy of x with rows in front): W overlapping
    loads (the cache serves all but the first), one write."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.program_id(1) * BD + tl.arange(0, BD)
    b = tl.program_id(2).to(tl.int64)
    cmask = c < d
    mask = (t[:, None] < T) & cmask[None, :]
    acc = tl.zeros((BT, BD), ACC) + tl.load(b_ptr + c, mask=cmask, other=0.0).to(ACC)[None, :]
    for j in tl.static_range(W):
        w = tl.load(w_ptr + c * W + j, mask=cmask, other=0.0).to(ACC)
        acc += w[None, :] * _conv_rows(x_ptr, tail_ptr, b, t[:, None] + j, c[None, :], mask, T,
                                       d, W, TAIL, ACC)
    tl.store(y_ptr + (b * T + t[:, None]) * d + c[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _conv_backward_kernel(dy_ptr, x_ptr, tail_ptr, w_ptr, dx_ptr, dtail_ptr, dw_ptr, db_ptr,
                          T, d, W: tl.constexpr, TAIL: tl.constexpr, BT: tl.constexpr,
                          TILES: tl.constexpr, BD: tl.constexpr, ACC: tl.constexpr):
    """For the rows s of xp = [tail | x] (zeros for the tail without TAIL) in this
    program's TILES tiles of BT: d xp[s] = Σ_j
    w[:, j]·dy[s - j]; and its share of d w[:, j] = Σ_s xp[s]·dy[s - j] and d bias =
    Σ_t dy[t] (each pair (t, j) counted by the one tile holding s = t + j), written to
    row (b, program) for torch to sum. W <= CONV_MAX_WIDTH: the taps' weights loaded once
    and one accumulator tile per tap, in the loads' layout, summed over the tiles
    element-wise and across rows once at the end. (A sum across rows, or a weight vector
    loaded in the loop, changes layout through shared memory behind a barrier; one per
    tap and tile made the first version 5x slower than torch's on an H200.)"""
    c = tl.program_id(1) * BD + tl.arange(0, BD)
    b = tl.program_id(2).to(tl.int64)
    cmask = c < d
    rows = T + W - 1
    w0 = tl.load(w_ptr + c * W, mask=cmask, other=0.0).to(ACC)[None, :]
    w1 = tl.load(w_ptr + c * W + 1, mask=cmask & (W > 1), other=0.0).to(ACC)[None, :]
    w2 = tl.load(w_ptr + c * W + 2, mask=cmask & (W > 2), other=0.0).to(ACC)[None, :]
    w3 = tl.load(w_ptr + c * W + 3, mask=cmask & (W > 3), other=0.0).to(ACC)[None, :]
    dw0 = tl.zeros((BT, BD), ACC)
    dw1 = tl.zeros((BT, BD), ACC)
    dw2 = tl.zeros((BT, BD), ACC)
    dw3 = tl.zeros((BT, BD), ACC)
    db = tl.zeros((BT, BD), ACC)
    for i in range(0, TILES):  # a constexpr bound: fine for every interpreter
        s = (tl.program_id(0) * TILES + i) * BT + tl.arange(0, BT)
        smask = (s[:, None] < rows) & cmask[None, :]
        x = _conv_rows(x_ptr, tail_ptr, b, s[:, None], c[None, :], smask, T, d, W, TAIL, ACC)
        dx = tl.zeros((BT, BD), ACC)
        for j in tl.static_range(W):
            t = s - j
            tmask = (t[:, None] >= 0) & (t[:, None] < T) & cmask[None, :]
            g = tl.load(dy_ptr + (b * T + t[:, None]) * d + c[None, :], mask=tmask,
                        other=0.0).to(ACC)
            if j == 0:
                dx += w0 * g
                dw0 += x * g
                db += g
            elif j == 1:
                dx += w1 * g
                dw1 += x * g
            elif j == 2:
                dx += w2 * g
                dw2 += x * g
            else:
                dx += w3 * g
                dw3 += x * g
        _conv_store_rows(dx_ptr, dtail_ptr, dx, b, s[:, None], c[None, :], smask, T, d, W, TAIL)
    out = dw_ptr + (b * tl.num_programs(0) + tl.program_id(0)) * W * d + c
    tl.store(out, tl.sum(dw0, axis=0), mask=cmask)
    if W > 1:
        tl.store(out + d, tl.sum(dw1, axis=0), mask=cmask)
    if W > 2:
        tl.store(out + 2 * d, tl.sum(dw2, axis=0), mask=cmask)
    if W > 3:
        tl.store(out + 3 * d, tl.sum(dw3, axis=0), mask=cmask)
    tl.store(db_ptr + (b * tl.num_programs(0) + tl.program_id(0)) * d + c, tl.sum(db, axis=0),
             mask=cmask)


LN_ROWS = 16  # rows per backward program: partial weight gradients are n / 16 rows


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """What a kernel computes in for these tensors: fp32, or fp64 if any is fp64."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def acc(*tensors: Tensor) -> tl.dtype:
    """compute_dtype as the kernels' ``ACC`` constexpr."""
    return tl.float64 if compute_dtype(*tensors) == torch.float64 else tl.float32


def _ln_forward(x: Tensor, r: Tensor | None, weight: Tensor, bias: Tensor, eps: float,
                out_dtype: torch.dtype, amax: bool = False, gate: Tensor | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(h = x + r (x + σ(gate)·r with a gate), or x itself without r; LN(h) in out_dtype;
    mean; rstd; with ``amax`` each row's largest |LN(h)| (n, 1), else None)."""
    n, d = x.shape
    h = x if r is None else x.new_empty((n, d), dtype=torch.promote_types(x.dtype, r.dtype))
    y = x.new_empty((n, d), dtype=out_dtype)
    stats = torch.promote_types(h.dtype, torch.float32)  # as the operator's torch version
    mean, rstd = x.new_empty(n, dtype=stats), x.new_empty(n, dtype=stats)
    part = x.new_empty((n, 1), dtype=torch.float32) if amax else None
    if n:
        _ln_forward_kernel[(n,)](x, x if r is None else r, x if gate is None else gate, h,
                                 weight, bias, y, mean, rstd, mean if part is None else part,
                                 d, eps, BD=triton.next_power_of_2(d),
                                 ACC=acc(h, weight, bias), ADD=r is not None,
                                 GATE=gate is not None, AMAX=amax, num_warps=4)
    return h, y, mean, rstd, part


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float,
               out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    return _ln_forward(x, None, weight, bias, eps, out_dtype)[1:4]


def add_layer_norm(x: Tensor, r: Tensor, weight: Tensor, bias: Tensor, eps: float,
                   out_dtype: torch.dtype, gate: Tensor | None = None
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _ln_forward(x, r, weight, bias, eps, out_dtype, gate=gate)[:4]


def add_layer_norm_with_scale(x: Tensor, r: Tensor, weight: Tensor, bias: Tensor, eps: float,
                              out_dtype: torch.dtype, fp8: torch.dtype,
                              gate: Tensor | None = None, *, tiny: float
                              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``ten::add_layer_norm_with_scale``: add_layer_norm's four, and the norm's one
    float8 scale for ``fp8`` from the rows' maxima the pass took (one float a row)."""
    h, y, mean, rstd, part = _ln_forward(x, r, weight, bias, eps, out_dtype, amax=True,
                                         gate=gate)
    return h, y, mean, rstd, fp8_scale(part, fp8, None, tiny=tiny)


def _ln_backward(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor,
                 dh: Tensor | None, r_dtype: torch.dtype | None,
                 r: Tensor | None = None, gate: Tensor | None = None
                 ) -> tuple[Tensor, Tensor | None, Tensor, Tensor, Tensor | None]:
    """(dx (+ dh), dx again in r_dtype (None without r_dtype) or, with the forward's r and
    gate, the gate's d r; d weight; d bias; d gate (None ungated))."""
    n, d = x.shape
    programs = max(1, triton.cdiv(n, LN_ROWS))
    dx = torch.empty_like(x)
    dr = (torch.empty_like(r) if gate is not None
          else None if r_dtype is None else torch.empty_like(x, dtype=r_dtype))
    dgate = None if gate is None else torch.empty_like(gate)
    dw = x.new_zeros((programs, d), dtype=compute_dtype(dy, x, weight))
    db = torch.zeros_like(dw)
    if n:
        _ln_backward_kernel[(programs,)](dy, x, weight, mean, rstd, x if dh is None else dh,
                                         dx, dx if dr is None else dr, x if r is None else r,
                                         x if gate is None else gate,
                                         dx if dgate is None else dgate, dw, db, n, d,
                                         ROWS=LN_ROWS, BD=triton.next_power_of_2(d),
                                         ACC=acc(dy, x, weight), DH=dh is not None,
                                         DR=dr is not None, GATE=gate is not None,
                                         num_warps=4)
    return dx, dr, dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype), dgate


def layer_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor,
                        rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    dx, _, dw, db, _ = _ln_backward(dy, x, weight, mean, rstd, None, None)
    return dx, dw, db


def add_layer_norm_backward(dh: Tensor | None, dy: Tensor, h: Tensor, weight: Tensor,
                            mean: Tensor, rstd: Tensor, r_dtype: torch.dtype,
                            r: Tensor | None = None, gate: Tensor | None = None
                            ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    same = r_dtype == h.dtype  # then dx serves both inputs: an empty dr, as the operator's
    dx, dr, dw, db, dgate = _ln_backward(dy, h, weight, mean, rstd, dh,
                                         None if same else r_dtype, r, gate)
    empty = h.new_empty(0)
    return dx, empty if dr is None else dr, dw, db, empty if dgate is None else dgate


def _swiglu_cut(ab: Tensor) -> tuple[int, int, int]:
    """(rows, H, columns per program) of ab (..., 2H)."""
    h = ab.shape[-1] // 2
    return (ab.numel() // (2 * h) if h else 0), h, min(1024, triton.next_power_of_2(max(h, 1)))


def _swiglu_forward(ab: Tensor, amax: bool) -> tuple[Tensor, Tensor | None]:
    """(y, and with ``amax`` the partial maxima (2, programs): of |y|, and of the gain)."""
    rows, h, bh = _swiglu_cut(ab)
    grid = (rows, triton.cdiv(h, bh))
    y = ab.new_empty(*ab.shape[:-1], h)
    part = ab.new_empty((2, grid[0] * grid[1]), dtype=torch.float32) if amax else None
    if rows:
        _swiglu_forward_kernel[grid](ab, y, y if part is None else part, h, BH=bh,
                                     ACC=acc(ab), AMAX=amax, num_warps=4)
    return y, part


def swiglu(ab: Tensor) -> Tensor:
    return _swiglu_forward(ab, amax=False)[0]


def swiglu_backward(dy: Tensor, ab: Tensor) -> Tensor:
    rows, h, bh = _swiglu_cut(ab)
    dab = torch.empty_like(ab)
    if rows:
        _swiglu_backward_kernel[(rows, triton.cdiv(h, bh))](dy, ab, dab, h, BH=bh,
                                                            ACC=acc(dy, ab), num_warps=4)
    return dab


def swiglu_with_scale(ab: Tensor, dtype: torch.dtype, *,
                      tiny: float) -> tuple[Tensor, Tensor, Tensor]:
    """``ten::swiglu_with_scale``: y, its float8 scale for ``dtype`` and the largest gain,
    from the maxima the SwiGLU pass took as it wrote y (a reduction of one float a program
    each, not a pass over y); ``tiny`` as ten.kernels.fp8 binds it for its own scales."""
    y, part = _swiglu_forward(ab, amax=True)
    return y, fp8_scale(part[:1], dtype, None, tiny=tiny), part[1].amax()


# the float8 backward's tile (tokens x columns) and warps: 32 x 32, a transposed row of 32
# float8 bytes (a DRAM sector) a store. Writing [d a | d b] in float8 by rows and
# transposed beside y, 32 x 64 took 128 registers (Triton 3.7.1) and 166-182 (3.6, the lent
# GPUs'), 2-4 programs an SM; 32 x 32 takes 48 and 80-89, 5-10 (benchmarks/kernel_check.py)
SWIGLU_F8_BR, SWIGLU_F8_BC, SWIGLU_F8_WARPS = 32, 32, 4


def swiglu_backward_float8(dy: Tensor, ab: Tensor, y_scale: Tensor, grad_scale: Tensor,
                           grad_dtype: torch.dtype, y_dtype: torch.dtype,
                           rows_to: int) -> tuple[Tensor, Tensor, Tensor]:
    """``ten::swiglu_backward_float8``: [d a | d b] in ``grad_dtype`` with ``grad_scale``
    by its rows (M', 2H) and transposed (2H, M'), and y in ``y_dtype`` with ``y_scale``
    transposed (H, M'), each with zero rows up to M' a multiple of ``rows_to``; dy (M, H)
    and ab (M, 2H) are read only."""
    M, h = dy.shape
    Mp = M + (-M % rows_to)
    grid = (triton.cdiv(Mp, SWIGLU_F8_BR), triton.cdiv(h, SWIGLU_F8_BC))
    dab8 = ab.new_empty((Mp, 2 * h), dtype=grad_dtype)
    dab8_t = ab.new_empty((2 * h, Mp), dtype=grad_dtype)
    y8_t = ab.new_empty((h, Mp), dtype=y_dtype)
    g8, g_top, g_mant, g_emin = FORMATS[grad_dtype]
    y8, y_top, y_mant, y_emin = FORMATS[y_dtype]
    if M:
        _swiglu_backward_float8_kernel[grid](
            dy, ab, dab8, dab8_t, grad_scale, y_scale, y8_t, M, Mp, h, G8=g8, G_TOP=g_top,
            G_MANT=g_mant, G_EMIN=g_emin, Y8=y8, Y_TOP=y_top, Y_MANT=y_mant, Y_EMIN=y_emin,
            BR=SWIGLU_F8_BR, BC=SWIGLU_F8_BC, num_warps=SWIGLU_F8_WARPS)
    return dab8, dab8_t, y8_t


# A conv forward program's channels and tokens: one tile.
CONV_BD, CONV_BT = 128, 16
CONV_MAX_WIDTH = 4  # the backward kernel's accumulators; wider convolutions run torch's


@dataclass(frozen=True)
class ConvTiles:
    """A conv backward program's work: ``tiles`` tiles of ``bt`` tokens in a row (its
    weight-gradient share summed over them: fewer shares for torch to add up), each ``bd``
    channels wide, in ``warps`` warps."""

    bt: int
    tiles: int
    bd: int
    warps: int

    @property
    def tokens(self) -> int:
        return self.bt * self.tiles

    def __str__(self) -> str:
        return f"{self.tiles}x{self.bt} tokens x {self.bd} channels, {self.warps} warps"


# The shipped tile, then the ones the GPU suite's `conv` section times beside it (registers
# and programs per SM: benchmarks/kernel_check.py). The shipped one holds ~128 registers a
# thread, 4 programs an SM; half the channels, or half the tokens a tile, ~72 and 7.
CONV_BACKWARD = ConvTiles(bt=8, tiles=8, bd=128, warps=4)
CONV_BACKWARD_CANDIDATES = (CONV_BACKWARD, ConvTiles(bt=8, tiles=8, bd=64, warps=4),
                            ConvTiles(bt=4, tiles=16, bd=128, warps=4))


def _conv_grid(rows: int, d: int, B: int, per_program: int, bd: int) -> tuple[int, int, int]:
    return triton.cdiv(rows, per_program), triton.cdiv(d, bd), B


def _has_tail_rows(tail: Tensor | None, W: int) -> bool:
    """Whether the kernels read a tail: one given, with rows (a width-1 convolution's has
    none). Without, the kernels get x's pointer in its place, never read."""
    return tail is not None and W > 1


def causal_conv(x: Tensor, tail: Tensor | None, weight: Tensor, bias: Tensor) -> Tensor:
    B, T, d = x.shape
    W = weight.shape[1]
    y = torch.empty_like(x)
    tail_rows = _has_tail_rows(tail, W)
    if y.numel():
        _conv_forward_kernel[_conv_grid(T, d, B, CONV_BT, CONV_BD)](
            x, tail if tail_rows else x, weight.contiguous(), bias, y, T, d, W=W,
            TAIL=tail_rows, BT=CONV_BT, BD=CONV_BD, ACC=acc(x, weight, bias), num_warps=4)
    return y


def causal_conv_backward(dy: Tensor, x: Tensor, tail: Tensor | None, weight: Tensor,
                         bias: Tensor, tiles: ConvTiles = CONV_BACKWARD
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    B, T, d = x.shape
    W = weight.shape[1]
    if W > CONV_MAX_WIDTH:
        raise ValueError(f"the convolution's backward kernel takes widths up to "
                         f"{CONV_MAX_WIDTH}, got {W}")
    grid = _conv_grid(T + W - 1, d, B, tiles.tokens, tiles.bd)
    dx = torch.empty_like(x)
    dtail = x.new_empty(0) if tail is None else torch.zeros_like(tail)
    dtype = compute_dtype(dy, x, weight)
    dw = x.new_zeros((B * grid[0], W, d), dtype=dtype)  # each program's share
    db = x.new_zeros((B * grid[0], d), dtype=dtype)
    tail_rows = _has_tail_rows(tail, W)
    if x.numel():  # (no rows of x: no gradient for the tail either)
        _conv_backward_kernel[grid](
            dy, x, tail if tail_rows else x, weight.contiguous(), dx,
            dtail if tail_rows else dx, dw, db, T, d, W=W,
            TAIL=tail_rows, BT=tiles.bt, TILES=tiles.tiles, BD=tiles.bd,
            ACC=acc(dy, x, weight), num_warps=tiles.warps)
    # (d, W) with the strides of the operator's fake (torch.compile checks them)
    dweight = weight.new_empty((d, W)).copy_(dw.sum(0).t())
    return dx, dtail, dweight, db.sum(0).to(bias.dtype)
