"""The LM head's three GEMMs in float8 (``LMConfig.fp8_head``), chunk by chunk as the
chunked loss runs them (ten.kernels.loss): at small_32k's widths the head is 28% of the
model's FLOPs (d 1,024 by a vocabulary of 32,000), and the feed-forward block's float8
leaves it the largest bf16 GEMM time of the step.

Per chunk of R rows of the hidden states h (N, d), against the tied embedding W (V, d):

* ``logits = h Wᵀ``: h and W in e4m3, one scale a tensor each (h's over all N rows, so
  every chunk's logits share it), W cast once a call into both layouts its GEMMs read;
  the logits come out in the autocast dtype, as the bf16 head's.
* the softmax's gradient ``g = (softmax(logits) - onehot(target)) · w_r`` (w_r the row's
  weight in the mean, 1/n) written in e5m2 by the pass that computes it
  (``ten::cross_entropy_rows_float8``), by its rows and transposed, with a scale known
  before it is computed: |softmax - onehot| <= 1, so |g| <= max w_r. No bf16 copy of g is
  made and no amax is taken of it. e5m2 keeps ~30 binades below that bound: probabilities
  under ~2^-31 of it flush to zero.
* ``d h = g W`` (into the autocast dtype) and ``d W += gᵀ h`` (float32, into the sum):
  ``_scaled_mm`` has no accumulating form, so each chunk's d W is written in float32 and
  added, a V x d pass the bf16 head does in its GEMM's epilogue.

Without gradients (evaluation) the logits are computed the same way, and the softmax is
the bf16 head's rows function. What float8 costs the loss is measured by the GPU suite's
``fp8`` section (the loss after 200 steps with and without the head in float8); the field
mostly keeps the head in bf16, so this is off unless a job sets it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import Tensor

from ten.kernels import fp8
from ten.kernels.fp8 import ALIGN, E4M3, E5M2, TINY
from ten.kernels.ops import define, register_cuda

# ten.kernels.loss's softmax of a chunk's rows, asked for no gradient: (logits, targets,
# None) -> (the rows' losses, None)
LossRowsFn = Callable[[Tensor, Tensor, None], "tuple[Tensor, Tensor | None]"]


def gradient_scale(row_scale: Tensor) -> Tensor:
    """The e5m2 scale of the softmax's gradient: its bound max w_r (|softmax - onehot| <= 1)
    on e5m2's largest value, floored as an amax of zeros is (all rows ignored)."""
    return row_scale.amax().float().clamp_min(TINY) / torch.finfo(E5M2).max


def rows_float8_reference(logits: Tensor, targets: Tensor, scale: Tensor, g_scale: Tensor,
                          rows_to: int) -> tuple[Tensor, Tensor, Tensor]:
    """``ten::cross_entropy_rows_float8`` in torch's ops: (per-row loss (R,) fp32, the
    gradient g (R, V) in e5m2, gᵀ (V, R') in e5m2 with zero columns up to a multiple of
    ``rows_to``), g = (softmax - onehot) · scale_r rounded with ``g_scale``."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    t = targets[:, None]
    loss = lse - x.gather(1, t).squeeze(1)
    g = (x - lse[:, None]).exp_()
    g.scatter_add_(1, t, torch.full_like(t, -1, dtype=g.dtype))
    g.mul_(scale[:, None].float())
    return (loss, fp8.float8_copy(g, g_scale, E5M2, False, 1),
            fp8.float8_copy(g, g_scale, E5M2, True, rows_to))


def _rows_float8_fake(logits, targets, scale, g_scale, rows_to):
    R, V = logits.shape
    Rp = R + (-R % rows_to)
    return (logits.new_empty(R, dtype=torch.float32), logits.new_empty((R, V), dtype=E5M2),
            logits.new_empty((V, Rp), dtype=E5M2))


_rows_float8 = define("cross_entropy_rows_float8(Tensor logits, Tensor targets, Tensor scale, "
                      "Tensor g_scale, int rows_to) -> (Tensor, Tensor, Tensor)",
                      rows_float8_reference, _rows_float8_fake)


def chunk_losses(hidden: Tensor, weight: Tensor, targets: Tensor, valid: Tensor,
                 row_scale: Tensor | None, rows: int, compute: torch.dtype, rows_fn: LossRowsFn,
                 grad_h: Tensor | None, grad_w: Tensor | None) -> Tensor:
    """The sum of the per-row losses of ``targets`` (N,) (ignored rows given any valid
    index, and ``valid`` False), the head's GEMMs in float8, ``rows`` rows a chunk; with
    ``row_scale`` (N,) (the rows' weights in the mean), fills ``grad_h`` (N, d) and adds
    into ``grad_w`` (V, d) float32 the gradients of Σ_r w_r · loss_r; without, the rows'
    losses are ``rows_fn``'s (the bf16 head's softmax)."""
    s_w = fp8.scale_of(weight, E4M3)
    w8, w8_t = fp8.cast_both(weight, s_w, E4M3)  # (V, d) for the logits, (d, V) for d h
    s_h = fp8.scale_of(hidden, E4M3)
    s_g = None if row_scale is None else gradient_scale(row_scale)
    loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], rows):
        sl = slice(start, start + rows)
        n = targets[sl].shape[0]
        if grad_w is not None:  # d W's sum runs over the rows: zero rows up to 16
            h8, h8_t = fp8.cast_both(hidden[sl], s_h, E4M3, rows_to=ALIGN)
            h8 = h8[:n]
        else:
            h8, h8_t = fp8.cast(hidden[sl], s_h, E4M3), None
        logits = fp8.scaled_mm(h8, w8.t(), s_h, s_w, compute)  # (R, V)
        if row_scale is None:
            row_loss, _ = rows_fn(logits, targets[sl], None)
        else:
            row_loss, g8, g8_t = _rows_float8(logits, targets[sl], row_scale[sl], s_g, ALIGN)
            del logits  # before the gradients' GEMMs: one chunk's logits at a time
            if grad_h is not None:
                grad_h[sl].copy_(fp8.scaled_mm(g8, w8_t.t(), s_g, s_w, compute))
            if grad_w is not None:
                grad_w += fp8.scaled_mm(g8_t, h8_t.t(), s_g, s_h, torch.float32)
            del g8, g8_t  # before the next chunk's logits
        loss_sum += (row_loss.float() * valid[sl]).sum()
    return loss_sum


if torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    from ten.kernels import loss_fused as _k

    register_cuda("cross_entropy_rows_float8", _k.cross_entropy_rows_float8)
