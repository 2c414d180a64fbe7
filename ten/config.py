"""The library's training configuration, its names, and its field errors: no torch.

One declaration per setting: :class:`TrainConfig`'s fields carry their type, bounds
(:class:`Range`), default and description (:class:`Doc`); ``runner/job/schema.py`` builds
the job's train section from them, and ``runner/job/library.py`` builds a TrainConfig
from a job by field name (the runner alone knows which job key holds which field). The
name tuples are what the schema accepts; the CLI imports them without importing torch.

A wrong field value in a library config raises :class:`FieldError`, which carries the
field's name, the problem and the value; the job layer points at ``model.<field>`` from
those, never by parsing the message. Other messages of the library name a setting by its
config and field (``TrainConfig.lr``, ``DataConfig.tokenizer.path``), never by a job key:
the runner shows those names as the keys a job file sets.
"""

from __future__ import annotations

import numbers
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

PRESET_NAMES = ("tiny", "small", "small_32k", "medium", "large")  # ten.model.presets.PRESETS
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adamw8bit")
LOSSES = ("auto", "chunked", "fused", "liger", "reference")  # ten.kernels.loss's backends
FP8_HEAD_LOSSES = ("auto", "chunked", "fused")  # those that run a model's fp8_head
SCAN_BACKENDS = ("auto", "chunked", "fused", "ref")  # ten.kernels.scan.BACKENDS, and auto
FP8_SCALINGS = ("tensor", "row")  # ten.kernels.fp8's: a scale a tensor, or a row
FP8_MODES = ("off", *FP8_SCALINGS)  # a model's fp8 field
FP8_ALIGN = 16  # float8 GEMMs' widths: multiples of this (CUDA's _scaled_mm)
SCHEDULES = ("cosine", "onecycle", "constant", "wsd")  # ten.train.schedule's shapes
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
class Range:
    """A numeric field's bounds (``Annotated`` metadata): the library checks them, and the
    job schema is built from them. For a tuple, each item's bounds."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value``, or None."""
        for bound, op, ok in ((self.ge, ">=", lambda b: value >= b),
                              (self.gt, ">", lambda b: value > b),
                              (self.le, "<=", lambda b: value <= b),
                              (self.lt, "<", lambda b: value < b)):
            if bound is not None and not ok(bound):
                return f"must be {op} {bound:g}"
        return None


class Doc(str):
    """A field's one-line description (``Annotated`` metadata), for the job schema."""


def budget_problem(max_steps: Any, max_tokens: Any) -> tuple[str | None, str] | None:
    """The one rule of a training budget, exactly one of max_steps and max_tokens: when
    broken, (the field to fix, or None for both, and why); the job checks it too, with
    every other problem of the file."""
    if max_steps is not None and max_tokens is not None:
        return "max_tokens", "give either max_steps or max_tokens, not both"
    if max_steps is None and max_tokens is None:
        return None, "no budget: set max_steps or max_tokens (e.g. max_steps: 300)"
    return None


def check_fields(config: Any) -> None:
    """Every field's type, :class:`Range` and ``Literal`` choices, as :class:`FieldError`
    (an int is a float here; a bool is not a number)."""
    for name, hint in typing.get_type_hints(type(config), include_extras=True).items():
        value = getattr(config, name)
        base = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
        choices = typing.get_args(base) if typing.get_origin(base) is Literal else ()
        if choices:
            if value not in choices:
                raise FieldError(name, f"must be one of {', '.join(choices)}", value)
            continue
        want = _type_problem(base, value)
        if want:
            raise FieldError(name, f"must be {want}", value)
        ranges = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Range)]
        items = value if isinstance(value, tuple) else (value,)  # a tuple: each item's
        for bound in ranges if value is not None else ():
            why = next(filter(None, map(bound.problem, items)), None)
            if why:
                raise FieldError(name, why, value)


_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _type_problem(hint: Any, value: Any) -> str | None:
    """What ``value`` should have been for a field typed ``hint``, or None."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        return None if type(None) in options else _WORDS.get(options[0], "set")
    kind = next((o for o in options if o is not type(None)), hint)
    if typing.get_origin(kind) is tuple:
        items = typing.get_args(kind)
        ok = isinstance(value, tuple) and len(value) == len(items) and \
            all(_type_problem(i, v) is None for i, v in zip(items, value, strict=True))
        return None if ok else f"{len(items)} numbers"
    if kind not in _WORDS:
        return None
    # numpy's integers and floats are numbers too; a bool is not one
    accepted = {int: numbers.Integral, float: numbers.Real}.get(kind, kind)
    ok = isinstance(value, accepted) and (kind is bool or not isinstance(value, bool))
    return None if ok else _WORDS[kind]


@dataclass(frozen=True)
class TrainConfig:
    """How to train: the budget, the optimizer and its schedule, precision, evaluation.
    The only declaration of these settings: the job's ``train`` section is built from
    these fields (their types, bounds, defaults and descriptions)."""

    max_steps: Annotated[int | None, Range(ge=1), Doc("budget in optimizer steps")] = None
    max_tokens: Annotated[int | None, Range(ge=1), Doc("budget in training tokens")] = None
    batch_size: Annotated[int, Range(ge=1), Doc(
        "sequences per micro-batch (per process)")] = 8
    grad_accum: Annotated[int, Range(ge=1), Doc("micro-batches per optimizer step")] = 1
    lr: Annotated[float, Range(gt=0.0), Doc("peak learning rate")] = 3e-4
    min_lr_ratio: Annotated[float, Range(ge=0.0, le=1.0), Doc("final lr = lr * ratio")] = 0.1
    warmup_steps: Annotated[int, Range(ge=0), Doc("steps of linear warm-up to lr")] = 100
    seq_warmup_start: Annotated[int | None, Range(ge=1), Doc(
        "sequence-length warm-up: the first seq_warmup_steps train on sequences this long "
        "(seq_len over a power of two), doubling up to seq_len, with the same tokens per "
        "step; null: none")] = None
    seq_warmup_steps: Annotated[int, Range(ge=0), Doc(
        "steps of the sequence-length warm-up (shared equally by its lengths)")] = 0
    schedule: Annotated[Literal[SCHEDULES], Doc(
        "the lr schedule after warm-up: cosine, onecycle, constant, or wsd (level, then a "
        "decay over the last decay_fraction of the steps; a budget extended before the "
        "decay is as if it had been set from the start). A budget changed at a resume "
        "continues from the lr the run had, never jumping")] = "cosine"
    decay_fraction: Annotated[float, Range(gt=0.0, le=1.0), Doc(
        "wsd: the share of the steps after warm-up spent decaying")] = 0.2
    weight_decay: Annotated[float, Range(ge=0.0), Doc(
        "AdamW's decoupled weight decay; not applied to norms, biases, embeddings, "
        "eigenvalues")] = 0.1
    betas: Annotated[tuple[float, float], Range(ge=0.0, lt=1.0), Doc(
        "AdamW's beta1 and beta2")] = (0.9, 0.95)
    precision: Annotated[Literal[PRECISIONS], Doc(
        "auto: bf16 autocast on a GPU that has it, else fp32")] = "auto"
    optimizer: Annotated[Literal[OPTIMIZERS], Doc(
        "adamw8bit: 8-bit states (bitsandbytes, on CUDA)")] = "adamw"
    compile: Annotated[bool, Doc("torch.compile every block")] = False
    deterministic: Annotated[bool, Doc(
        "bit-identical steps on a GPU too (deterministic algorithms, a fixed cuBLAS "
        "workspace), so a resumed run matches an uninterrupted one; costs some speed")] = False
    grad_clip: Annotated[float, Range(ge=0.0), Doc(
        "max gradient norm; 0 disables (the norm is still logged)")] = 1.0
    eval_every: Annotated[int, Range(ge=0), Doc(
        "steps between evaluations; 0: only the final one")] = 100
    eval_batches: Annotated[int, Range(ge=1), Doc("held-out batches per evaluation")] = 20
    recall_probe: Annotated[bool, Doc(
        "at each evaluation also score in-context recall: random tokens repeated, the "
        "share of the repeat predicted (eval records' recall_repeat)")] = True
    state_health: Annotated[bool, Doc(
        "at each evaluation log a TEN's state per layer: decay |λ| and step Δ spread, the "
        "imaginary part's share of the state's energy (state records)")] = True
    log_every: Annotated[int, Range(ge=1), Doc("steps between log lines and records")] = 10
    init_from: Annotated[str | None, Doc(
        "start from a trained model's weights instead of random ones (fine-tuning): a run "
        "directory or a run's name in ./runs, s3://bucket/prefix/JOB, or a folder "
        "export-model wrote; its tokenizer is used, the model must have its shape, the "
        "optimizer and lr schedule start fresh. A run with a checkpoint of its own "
        "resumes that")] = None
    seed: Annotated[int, Range(ge=0), Doc("seeds the model, the data order and sampling")] = 1234
    device: Annotated[Literal[DEVICES], Doc("auto: CUDA when there is one")] = "auto"
    num_workers: Annotated[int, Range(ge=0), Doc("DataLoader worker processes")] = 2
    checkpoint_every: Annotated[int, Range(ge=1), Doc("steps between checkpoints")] = 500
    keep_last: Annotated[int, Range(ge=1), Doc("committed checkpoints kept")] = 3
    # Checked at log intervals, so up to log_every steps more may be skipped first (no
    # per-step host sync).
    max_nonfinite_steps: Annotated[int, Range(ge=0), Doc(
        "steps in a row with a non-finite loss or gradient norm that are skipped before the "
        "run stops with exit 9 (diverged)")] = 5
    loss: Annotated[Literal[LOSSES], Doc(
        "the loss kernel: auto (fused on CUDA, else chunked), chunked, fused (one Triton "
        "kernel per chunk), liger (Liger-Kernel's), or reference (B x T x V logits)")] = "auto"

    def __post_init__(self) -> None:
        broken = budget_problem(self.max_steps, self.max_tokens)
        if broken is not None:
            raise FieldError(broken[0] or "max_steps", broken[1])
        if self.seq_warmup_start is not None and self.seq_warmup_steps < 1:
            raise FieldError("seq_warmup_steps", "must be >= 1 with seq_warmup_start",
                             self.seq_warmup_steps)
        check_fields(self)
