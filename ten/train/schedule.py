"""Learning-rate schedules as pure functions of the step (tested from tables).

:class:`Schedule` gives the multiplier on the peak lr for the update that ends step
``step + 1`` (``step`` counts completed optimizer steps, starting at 0):

* ``constant``: linear warmup from 0, then 1.
* ``cosine``: linear warmup from 0, then a half cosine down to ``min_ratio`` at ``total``.
* ``onecycle``: a half-cosine ramp from 1/25 up to 1 over the warmup, then the same
  cosine down to ``min_ratio`` (the shape of PyTorch's OneCycleLR, without momentum
  cycling).
* ``wsd`` (warmup-stable-decay): linear warmup, then 1 until the last ``decay_fraction``
  of the steps after warm-up, then down to ``min_ratio`` along 1 - sqrt(progress) (the
  cool-down shape Hägele et al. 2024 found best). A budget extended before the decay
  began is the schedule the longer budget would have had from the start.

A budget or schedule changed at a resume never makes the lr jump: :meth:`Schedule.continued`
anchors the schedule at the resumed step and multiplier, and from there the same shape
runs from that multiplier to ``min_ratio`` at the new end (cosine and onecycle: a half
cosine; wsd: level until its decay starts, then its decay; constant: level). The anchor
is saved with each checkpoint, so later resumes keep it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ten.config import SCHEDULES

ONECYCLE_START = 1 / 25
# Two multipliers this close are the same lr (a resume recomputes the saved one in floats).
SAME_MULTIPLIER = 1e-9


@dataclass(frozen=True)
class Anchor:
    """Where a resume changed the schedule: from ``step`` on it runs from ``multiplier``."""

    step: int
    multiplier: float


@dataclass(frozen=True)
class Schedule:
    shape: str
    total: int
    warmup: int
    min_ratio: float
    decay_fraction: float = 0.2  # wsd only
    anchor: Anchor | None = None

    def __post_init__(self) -> None:
        if self.shape not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.shape!r}")

    def __call__(self, step: int) -> float:
        if self.anchor is not None and step >= self.anchor.step:
            return self._from(self.anchor.step, self.anchor.multiplier, step)
        if step < self.warmup:
            frac = (step + 1) / self.warmup
            if self.shape == "onecycle":
                return ONECYCLE_START + (1 - ONECYCLE_START) * (1 - math.cos(math.pi * frac)) / 2
            return frac
        return self._from(self.warmup, 1.0, step)

    def decay_start(self) -> int:
        """The first step of the decay (wsd; the others decay from the end of warm-up)."""
        if self.shape != "wsd":
            return self.warmup
        return self.total - math.ceil(self.decay_fraction * max(0, self.total - self.warmup))

    def _from(self, start: int, level: float, step: int) -> float:
        """``level`` at ``start``, then this shape's way down to min_ratio at ``total``."""
        if self.shape == "constant":
            return level
        begin = max(start, self.decay_start())
        if step < begin:
            return level
        progress = min(1.0, (step - begin) / max(1, self.total - begin))
        if self.shape == "wsd":
            fall = 1 - math.sqrt(progress)
        else:
            fall = (1 + math.cos(math.pi * progress)) / 2
        return self.min_ratio + (level - self.min_ratio) * fall

    def continued(self, step: int, multiplier: float) -> Schedule:
        """This schedule for a run resumed at ``step`` whose last lr was ``multiplier``
        times the peak: itself when it agrees there (a resume with the same budget and
        schedule), else anchored there so the lr goes on from where it was."""
        if abs(self(step) - multiplier) <= SAME_MULTIPLIER:
            return self
        return dataclasses.replace(self, anchor=Anchor(step, multiplier))

    def with_saved(self, anchor: list[float] | None) -> Schedule:
        """This schedule with the anchor a checkpoint saved (see :meth:`saved`; None: a
        checkpoint of an unchanged schedule), in place of any it had."""
        saved = None if anchor is None else Anchor(int(anchor[0]), float(anchor[1]))
        return self if saved == self.anchor else dataclasses.replace(self, anchor=saved)

    def saved(self) -> list[float] | None:
        """The anchor as a checkpoint keeps it (plain numbers: weights_only loads them)."""
        return None if self.anchor is None else [self.anchor.step, self.anchor.multiplier]


def lr_multiplier(step: int, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """The multiplier of ``schedule`` (no anchor) at ``step``."""
    return Schedule(schedule, total, warmup, min_ratio)(step)
