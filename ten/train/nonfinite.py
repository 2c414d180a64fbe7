"""Steps with a non-finite loss or gradient norm: skipped without a host sync where the
optimizer allows it, and counted on the device so the training loop never waits for the
count; read only where the loop syncs anyway (log lines, checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()`` unless the 0-dim bool tensor ``skip`` is true.

    Fused Adam/AdamW (the default on a GPU) and ``ten.train.adamw8bit`` on a GPU take the
    decision on the device, as fused AdamW does for a GradScaler's ``found_inf``: no host
    sync, and a skipped step leaves the weights, moments and step counts exactly as they
    were. Other optimizers (the CPU default) need the flag on the host: one sync per
    step, which costs nothing on a CPU (about 0.3 us, measured)."""
    if optimizer.defaults.get("fused") or getattr(optimizer, "skips_on_device", False):
        optimizer.found_inf = skip.float()  # read by Adam.step, as GradScaler sets it
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not skip.item():  # host sync: see above
        optimizer.step()


@dataclass(frozen=True)
class NonFiniteStats:
    streak: int  # skipped steps in a row, ending with the latest step
    worst: int  # the longest such run since the last log line
    skipped: int  # steps skipped since the last log line
    loss: int  # ... of which had a non-finite loss
    grad: int  # ... of which had a non-finite grad norm
    streak_loss: int  # 1 if a step of the current streak had a non-finite loss
    streak_grad: int  # ... a non-finite grad norm

    def what(self, streak: bool = False) -> str:
        """``loss``, ``grad norm`` or both: in the window, or in the current streak."""
        loss, grad = (self.streak_loss, self.streak_grad) if streak else (self.loss, self.grad)
        return " and ".join(k for k, n in (("loss", loss), ("grad norm", grad)) if n) or "value"


class NonFiniteCounter:
    """Skipped steps, counted on the device so the loop never waits for it; read only
    where the loop syncs anyway (log lines, checkpoints)."""

    def __init__(self, device: torch.device, streak: int = 0) -> None:
        self.streak = torch.tensor(streak, dtype=torch.int64, device=device)
        self.worst = self.streak.clone()
        self.counts = torch.zeros(3, dtype=torch.int64, device=device)  # skipped, loss, grad
        self.streak_kinds = torch.zeros(2, dtype=torch.int32, device=device)  # loss, grad

    def add(self, flags: torch.Tensor) -> None:
        bad = flags.any()
        self.streak.add_(1).mul_(bad)  # +1, or back to 0 after a good step
        torch.maximum(self.worst, self.streak, out=self.worst)
        self.counts.add_(torch.cat([bad.view(1), flags]))
        torch.maximum(self.streak_kinds, flags, out=self.streak_kinds).mul_(bad)

    def read(self) -> NonFiniteStats:
        """The counts (a host sync: call at log lines and checkpoints only)."""
        return NonFiniteStats(*torch.cat([self.streak.view(1), self.worst.view(1),
                                          self.counts, self.streak_kinds]).tolist())

    def new_window(self) -> None:
        self.worst.copy_(self.streak)
        self.counts.zero_()
