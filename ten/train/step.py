"""The step: one optimizer update over micro-batches (``train_step``) and the held-out
loss (``evaluate``). What stops the loop between steps is ``ten.train.stop.Stop``.

Both take the objective (``ten.kernels.loss.NextTokenLoss``, possibly DDP-wrapped) and return
device tensors: no host sync on the fused-optimizer path (``ten.train.nonfinite.step_unless``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ten.kernels.loss import NextTokenLoss
from ten.model.lm import LanguageModel
from ten.train.nonfinite import step_unless


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, micro_batches: list[torch.Tensor],
               amp_dtype: torch.dtype | None, grad_clip: float,
               ddp_no_sync: Callable[[], Any] | None = None,
               any_rank: Callable[[torch.Tensor], None] | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step over ``grad_accum`` micro-batches of (B, T + 1) token ids.

    ``model`` is the objective: ``model(inputs, targets) -> mean loss`` (a
    :class:`ten.kernels.loss.NextTokenLoss`, possibly DDP-wrapped or compiled). Returns (mean
    loss, grad norm before clipping, non-finite flags) as device tensors: no host sync on
    the fused-optimizer path (see :func:`step_unless`). The flags are
    ``[loss not finite, grad norm not finite]`` (int32, 0/1); a flagged step is skipped:
    the optimizer does not update. ``any_rank`` (an in-place max over ranks) makes every
    rank skip the same steps.
    """
    device_type = micro_batches[0].device.type
    total = torch.zeros((), device=micro_batches[0].device)
    n = len(micro_batches)
    # One autocast region for the step's forwards: autocast keeps each weight's cast until
    # the region ends, so the micro-batches after the first cast no weight again (the
    # weights change only at the optimizer step, after it). Backward runs outside autocast,
    # as it would after the region.
    with torch.autocast(device_type, dtype=amp_dtype or torch.float32,
                        enabled=amp_dtype is not None):
        for i, batch in enumerate(micro_batches):
            inputs, targets = batch[:, :-1], batch[:, 1:]
            sync_ctx = ddp_no_sync() if ddp_no_sync is not None and i < n - 1 \
                else contextlib.nullcontext()
            with sync_ctx:
                loss = model(inputs, targets) / n  # fp32: the loss computes in fp32
                with torch.autocast(device_type, enabled=False):
                    scaler.scale(loss).backward()
            total += loss.detach()
    scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    flags = torch.stack([~torch.isfinite(total), ~torch.isfinite(norm)]).int()
    if scaler.is_enabled():
        # fp16: overflowing gradients are the GradScaler's routine (it skips the step and
        # lowers its scale), not divergence; only a non-finite loss is flagged.
        flags[1] = 0
    if any_rank is not None:
        any_rank(flags)
    if scaler.is_enabled():
        scaler.step(optimizer)  # a non-finite loss has non-finite grads: skipped here too
    else:
        step_unless(optimizer, flags.any())
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total, norm, flags


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterator[torch.Tensor], device: torch.device,
             amp_dtype: torch.dtype | None) -> float:
    """Mean next-token loss over held-out batches; ``model`` is the objective, as in
    :func:`train_step` (a bare language model is evaluated with the chunked loss)."""
    if isinstance(model, LanguageModel):
        model = NextTokenLoss(model, "chunked")
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device), 0
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            total += model(batch[:, :-1], batch[:, 1:])
        count += 1
    model.train(was_training)
    return (total / max(count, 1)).item()  # host sync: once per evaluation
