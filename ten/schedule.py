"""Learning-rate schedules as pure functions of the step (tested from tables).

Each returns the multiplier on the peak lr for the update that ends step ``step + 1``
(``step`` counts completed optimizer steps, starting at 0):

* ``constant``: linear warmup from 0, then 1.
* ``cosine``: linear warmup from 0, then a half cosine down to ``min_ratio`` at ``total``.
* ``onecycle``: a half-cosine ramp from 1/25 up to 1 over the warmup, then the same
  cosine down to ``min_ratio`` (the shape of PyTorch's OneCycleLR, without momentum
  cycling).
"""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "onecycle", "constant")
ONECYCLE_START = 1 / 25


def lr_multiplier(step: int, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if step < warmup:
        frac = (step + 1) / warmup
        if schedule == "onecycle":
            return ONECYCLE_START + (1 - ONECYCLE_START) * (1 - math.cos(math.pi * frac)) / 2
        return frac
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * progress)) / 2
