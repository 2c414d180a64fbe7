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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ten.kernels.ops import define

__all__ = ["INTERPRETED", "cross_entropy_rows"]

BLOCK_V = 1024  # logits per load: 2 KB of bf16 per row per step


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
