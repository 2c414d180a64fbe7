"""The ``fused`` loss backend's kernel: one chunk's cross-entropy and its gradient in one
Triton kernel, in place on the chunk's logits (see ``ten.kernels.loss``).

The chunked loss in torch ops passes over a chunk's (R, V) logits about ten times (a
cast to fp32, max, subtract, exp, sum, divide, scatter, scale, a cast back): ~58 bytes
per logit, 100 GB per flagship micro-batch (benchmarks/bench_traffic.py). Here each row
is one program that reads its logits twice and writes them once, in the matmul's dtype:

    pass 1   lse = log Σ_v exp(x_v)            online: a running max and a rescaled sum
    loss     lse - x_target                     (written per row, fp32)
    pass 2   x_v <- (exp(x_v - lse) - [v = target]) · scale    the gradient, in place

``scale`` is the row's weight in the mean (1/n for a counted row, 0 for an ignored one),
read from a device tensor: no host sync. Everything is computed in fp32 whatever the
logits' dtype. Imported only when the ``fused`` backend runs (``ten.kernels.loss`` works without
triton); under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, which is how the
tests compare it with the torch-ops chunked loss.

With the head in float8 (ten.kernels.loss_float8) ``ten::cross_entropy_rows_float8``'s
kernel runs the same two passes over a tile of rows, and writes the gradient in e5m2 by
its rows and transposed (what its two float8 GEMMs read), leaving the logits as they were.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ten.kernels.fp8_kernels import FORMATS, quantize
from ten.kernels.ops import define

__all__ = ["INTERPRETED", "cross_entropy_rows", "cross_entropy_rows_float8"]

BLOCK_V = 1024  # logits per load: 2 KB of bf16 per row per step
# the float8 gradient's kernel: a tile of rows x logits, so that the transposed layout is
# written in runs of BLOCK_R bytes along a column
BLOCK_R, BLOCK_RV = 32, 64


@triton.jit
def _cross_entropy_rows_kernel(x_ptr, stride, target_ptr, scale_ptr, loss_ptr, V,
                               BV: tl.constexpr, GRAD: tl.constexpr):
    r = tl.program_id(0)
    row = x_ptr + r.to(tl.int64) * stride
    cols = tl.arange(0, BV)
    m = -float("inf")  # the running max, and the sum of exp(x - m) so far
    s = 0.0
    # while, not range(0, V, BV): Triton 3.6's interpreter cannot take a runtime bound
    v0 = 0
    while v0 < V:
        x = tl.load(row + v0 + cols, mask=v0 + cols < V, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
        v0 += BV
    lse = m + tl.log(s)
    target = tl.load(target_ptr + r)
    tl.store(loss_ptr + r, lse - tl.load(row + target).to(tl.float32))
    if GRAD:
        scale = tl.load(scale_ptr + r).to(tl.float32)
        v0 = 0
        while v0 < V:
            idx = v0 + cols
            mask = idx < V
            x = tl.load(row + idx, mask=mask, other=0.0).to(tl.float32)
            g = (tl.exp(x - lse) - tl.where(idx == target, 1.0, 0.0)) * scale
            tl.store(row + idx, g.to(x_ptr.dtype.element_ty), mask=mask)
            v0 += BV


# True when triton built the kernel for its interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED = type(_cross_entropy_rows_kernel).__name__ == "InterpretedFunction"


@triton.jit
def _cross_entropy_rows_float8_kernel(x_ptr, stride, target_ptr, scale_ptr, g_scale_ptr,
                                      loss_ptr, g_ptr, g_t_ptr, R, Rp, V, OUT: tl.constexpr,
                                      TOP: tl.constexpr, MANT: tl.constexpr,
                                      EMIN: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    """BR rows' loss, and their gradient (softmax - onehot) · scale_r rounded to float8 with
    the one scale at g_scale_ptr, into g (R, V) and g_t (V, Rp); rows R..Rp of g_t zero."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    live = rows < R
    src = x_ptr + tl.minimum(rows, R - 1) * stride  # a row past R reads the last one
    cols = tl.arange(0, BV)
    m = tl.full((BR,), -float("inf"), tl.float32)
    s = tl.zeros((BR,), tl.float32)
    v0 = 0
    while v0 < V:
        x = tl.load(src[:, None] + v0 + cols[None, :], mask=(v0 + cols < V)[None, :],
                    other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
        v0 += BV
    lse = m + tl.log(s)
    target = tl.load(target_ptr + tl.minimum(rows, R - 1))
    tl.store(loss_ptr + rows, lse - tl.load(src + target).to(tl.float32), mask=live)
    scale = tl.where(live, tl.load(scale_ptr + tl.minimum(rows, R - 1)).to(tl.float32), 0.0)
    inverse = tl.math.div_rn(tl.full((1, 1), 1.0, tl.float32),
                             tl.load(g_scale_ptr + tl.zeros((1, 1), tl.int32)))
    v0 = 0
    while v0 < V:
        idx = (v0 + cols).to(tl.int64)
        inside = idx < V
        x = tl.load(src[:, None] + idx[None, :], mask=inside[None, :], other=0.0)
        g = (tl.exp(x.to(tl.float32) - lse[:, None]) -
             tl.where(idx[None, :] == target[:, None], 1.0, 0.0)) * scale[:, None]
        q = quantize(tl.where(live[:, None], g, 0.0), inverse, TOP, MANT, EMIN).to(OUT)
        tl.store(g_ptr + rows[:, None] * V + idx[None, :], q, mask=live[:, None] & inside[None, :])
        tl.store(g_t_ptr + idx[None, :] * Rp + rows[:, None], q,
                 mask=(rows < Rp)[:, None] & inside[None, :])
        v0 += BV


def cross_entropy_rows_float8(logits: Tensor, targets: Tensor, scale: Tensor,
                              g_scale: Tensor, rows_to: int
                              ) -> tuple[Tensor, Tensor, Tensor]:
    """The launcher of ``ten::cross_entropy_rows_float8`` (ten.kernels.loss_float8: its
    contract and torch version): the logits read twice, the gradient written once in each
    layout, 1 byte an element each."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError("logits must be (R, V), contiguous along the vocabulary")
    R, V = logits.shape
    Rp = R + (-R % rows_to)
    fmt, top, mant, emin = FORMATS[torch.float8_e5m2]
    loss = logits.new_empty(R, dtype=torch.float32)
    g = logits.new_empty((R, V), dtype=torch.float8_e5m2)
    g_t = logits.new_empty((V, Rp), dtype=torch.float8_e5m2)
    if R:
        _cross_entropy_rows_float8_kernel[(triton.cdiv(Rp, BLOCK_R),)](
            logits, logits.stride(0), targets.contiguous(), scale.contiguous(), g_scale, loss,
            g, g_t, R, Rp, V, OUT=fmt, TOP=top, MANT=mant, EMIN=emin, BR=BLOCK_R,
            BV=min(BLOCK_RV, triton.next_power_of_2(V)), num_warps=4)
    return loss, g, g_t


def cross_entropy_rows(logits: Tensor, targets: Tensor, scale: Tensor | None) -> Tensor:
    """Per-row loss (R,) in fp32 of ``logits`` (R, V) against ``targets`` (R,); with
    ``scale`` (R,) the logits are overwritten with d(Σ_r scale_r · loss_r)/d logits.

    ``targets`` must index into V (ignored rows: any valid index, and scale 0)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError("logits must be (R, V), contiguous along the vocabulary")
    return _rows_op(logits, targets.contiguous(),
                    None if scale is None else scale.contiguous())


def _rows_impl(logits: Tensor, targets: Tensor, scale: Tensor | None) -> Tensor:
    R, V = logits.shape
    loss = torch.empty(R, dtype=torch.float32, device=logits.device)
    if R:
        _cross_entropy_rows_kernel[(R,)](
            logits, logits.stride(0), targets, loss if scale is None else scale, loss, V,
            BV=min(BLOCK_V, triton.next_power_of_2(V)), GRAD=scale is not None, num_warps=4)
    return loss


def _rows_fake(logits, targets, scale):
    return logits.new_empty(logits.shape[0], dtype=torch.float32)


# A torch operator (ten.kernels.ops) that writes the logits in place: opaque to torch.compile, and
# traceable under FakeTensorMode (benchmarks/bench_traffic.py).
_rows_op = define("cross_entropy_rows(Tensor(a!) logits, Tensor targets, Tensor? scale) "
                  "-> Tensor", _rows_impl, _rows_fake)
