"""The library's training configuration, its names, and its field errors: no torch.

One set of defaults: :class:`TrainConfig` is what ``runner/job/schema.py``'s train
section defaults to (it reads them from here), and ``runner/job/library.py`` builds a
TrainConfig from a job by field name. The name tuples are what the schema accepts; the
CLI imports them without importing torch.

A wrong field value in a library config raises :class:`FieldError`, which carries the
field's name, the problem and the value; the job layer points at ``model.<field>`` from
those, never by parsing the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ARCHS = ("ten", "transformer")
PRESET_NAMES = ("tiny", "small", "small_32k", "medium", "large")  # ten.presets.PRESETS
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adamw8bit")
SCHEDULES = ("cosine", "onecycle", "constant")
LOSSES = ("auto", "chunked", "fused", "liger", "reference")  # ten.loss.LOSS_BACKENDS
DEVICES = ("auto", "cpu", "cuda")

_NO_VALUE = object()


class FieldError(ValueError):
    """``field``: ``problem`` (, got ``value``) — one config field's value is wrong."""

    def __init__(self, field: str, problem: str, value: Any = _NO_VALUE) -> None:
        self.field, self.problem = field, problem
        self.value = None if value is _NO_VALUE else value
        self.has_value = value is not _NO_VALUE
        got = f", got {value!r}" if self.has_value else ""
        super().__init__(f"{field}: {problem}{got}")


class UnknownFieldError(FieldError):
    """A field the config does not have; the message names the known ones."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.args = (message,)  # the message already names the field

    def __str__(self) -> str:
        return self.problem


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int | None = None  # the budget: max_steps or max_tokens (one is given)
    max_tokens: int | None = None
    batch_size: int = 8  # sequences per micro-batch per process
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: str = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    precision: str = "auto"
    optimizer: str = "adamw"
    compile: bool = False  # torch.compile every block (regional)
    # Bit-identical results on a GPU too (ten.trainer.make_deterministic); some speed.
    deterministic: bool = False
    grad_clip: float = 1.0  # 0 disables clipping (the norm is still logged)
    eval_every: int = 100
    eval_batches: int = 20
    log_every: int = 10
    seed: int = 1234
    device: str = "auto"
    num_workers: int = 2  # the job's data.num_workers
    checkpoint_every: int = 500  # the job's checkpoint.every_steps
    keep_last: int = 3  # the job's checkpoint.keep_last
    # Steps with a non-finite loss or grad norm are skipped; one more than this many in a
    # row stops the run (DivergedError). Checked at log intervals, so up to log_every
    # steps more may be skipped first (no per-step host sync).
    max_nonfinite_steps: int = 5
    # ten.loss backend: auto (the fused Triton kernel on CUDA, else chunked), chunked,
    # fused, liger (each raises where it cannot run) or reference (the plain B×T×V loss).
    loss: str = "auto"

    def __post_init__(self) -> None:
        if (self.max_steps is None) == (self.max_tokens is None):
            raise FieldError("max_steps", "give exactly one of max_steps and max_tokens")
        for name, known in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS),
                            ("schedule", SCHEDULES), ("loss", LOSSES), ("device", DEVICES)):
            if getattr(self, name) not in known:
                raise FieldError(name, f"must be one of {', '.join(known)}",
                                 getattr(self, name))


# Job keys outside the train section that TrainConfig holds: field -> (section, key).
FROM_OTHER_SECTIONS = {"num_workers": ("data", "num_workers"),
                       "checkpoint_every": ("checkpoint", "every_steps"),
                       "keep_last": ("checkpoint", "keep_last")}
