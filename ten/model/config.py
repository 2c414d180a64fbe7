"""The two model families' configurations: no torch.

Like :class:`ten.config.TrainConfig`, each field is declared once with its type, bounds
(:class:`~ten.config.Range`), choices (``Literal``), default and description
(:class:`~ten.config.Doc`): the library checks them when a config is made, and the job's
``model`` section types its overrides from them (``runner/job/schema.py``). What involves
several fields (heads dividing eigenstates, say) is checked here too, as a
:class:`~ten.config.FieldError` on the field a user would change.

``ten.model.ten`` and ``ten.model.transformer`` build the modules; ``ten.model.presets``
names the sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

from ten.config import FP8_ALIGN, FP8_MODES, SCAN_BACKENDS, Doc, FieldError, Range, check_fields

MLP_KINDS = ("swiglu", "gelu")
POSITIONS = ("rope", "learned")  # the transformer's
RESIDUAL_DTYPES = ("fp32", "bf16")
STATES = ("vector", "matrix")  # what a TEN's eigenstate holds

Count = Annotated[int, Range(ge=1)]


def mlp_hidden_size(d_model: int, ratio: float, multiple: int = 64) -> int:
    """Hidden width ratio·d rounded up to a multiple (tensor-core friendly)."""
    return max(multiple, -(-int(ratio * d_model) // multiple) * multiple)


@dataclass(frozen=True)
class LMConfig:
    """What both families have: a language model's vocabulary, width, depth, training
    length, feed-forward block and initialization, and how much of it recomputes its
    activations. An override of one of these shapes a transformer's TEN reference too
    (ten.model.presets.transformer_config)."""

    vocab_size: Annotated[Count, Doc("tokens in the vocabulary (a job takes its "
                                     "tokenizer's)")] = 4096
    d_model: Annotated[Count, Doc("width of the residual stream")] = 128
    n_layers: Annotated[Count, Doc("blocks")] = 4
    seq_len: Annotated[Count, Doc("training length; a job's is its data's")] = 256
    mlp: Annotated[Literal[MLP_KINDS], Doc("the feed-forward block")] = "swiglu"
    norm_eps: Annotated[float, Doc("LayerNorm's epsilon")] = 1e-5
    init_std: Annotated[float, Doc("standard deviation of the initial weights")] = 0.02
    grad_checkpointing: Annotated[bool, Doc(
        "recompute blocks' activations in the backward pass (less memory, more time)")] = False
    checkpoint_blocks: Annotated[int | None, Range(ge=0), Doc(
        "with grad_checkpointing: only the first N blocks (more than n_layers: all, so a "
        "job keeps it when it shrinks the model); null: all")] = None
    residual_dtype: Annotated[Literal[RESIDUAL_DTYPES], Doc(
        "the residual stream between blocks under bf16 autocast: fp32 (each sublayer's "
        "bf16 output added in fp32), or bf16 (as Megatron-LM and torchtitan train: half the "
        "stream's memory traffic and its saved copies; BENCHMARKS.md); without bf16 "
        "autocast the stream is in the model's dtype")] = "fp32"
    fp8: Annotated[Literal[FP8_MODES], Doc(
        "the feed-forward block's GEMMs (forward and backward) in float8, with one scale a "
        "tensor or one a row (ten.kernels.fp8): a GPU with FP8 tensor cores (compute "
        "capability 8.9+: L40S, H100). The mixers stay in the autocast dtype, and the "
        "head too unless fp8_head is set. off: no float8")] = "off"
    fp8_head: Annotated[bool, Doc(
        "with fp8 on: the head's three GEMMs (the logits, their gradient into the hidden "
        "states and into the tied embedding) in float8 too, with one scale a tensor "
        "whatever fp8's scaling (ten.kernels.loss_float8): 28% of small_32k's FLOPs. Off, as "
        "the field mostly trains: the head stays in the autocast dtype")] = False

    def _check_fp8(self) -> None:
        """float8 GEMMs take widths that are multiples of FP8_ALIGN (CUDA's _scaled_mm)."""
        if self.fp8 != "off" and (self.d_model % FP8_ALIGN or self.mlp_hidden % FP8_ALIGN):
            raise FieldError("fp8", f"needs d_model and the feed-forward width to be "
                             f"multiples of {FP8_ALIGN} (they are {self.d_model} and "
                             f"{self.mlp_hidden})", self.fp8)
        if self.fp8_head and self.fp8 == "off":
            raise FieldError("fp8_head", "needs fp8 set to tensor or row (the head's float8 "
                             "GEMMs come with the feed-forward block's)", self.fp8_head)
        if self.fp8_head and self.vocab_size % FP8_ALIGN:
            raise FieldError("fp8_head", f"needs vocab_size to be a multiple of {FP8_ALIGN} "
                             f"(it is {self.vocab_size})", self.fp8_head)


@dataclass(frozen=True)
class TENConfig(LMConfig):
    """A Temporal Eigenstate Network language model (docs/model.md); it runs at any
    length, whatever its seq_len."""

    n_eigenstates: Annotated[Count, Doc("K: complex eigenstates per layer")] = 64
    n_heads: Annotated[Count, Doc("heads of K/H eigenstates (divides n_eigenstates): "
                                  "the coupling's blocks, or a matrix state's heads")] = 4
    chunk_size: Annotated[Count, Doc("Q, the chunked scan's chunk (exact for any Q; 16 is "
                                     "a matrix state's fastest on a CPU)")] = 64
    scan_backend: Annotated[Literal[SCAN_BACKENDS], Doc(
        "the scan: auto (fused on CUDA, else chunked), chunked, fused (Triton) or ref "
        "(sequential)")] = "auto"
    # selective + conv_width 4, every preset's mode, by measurement (benchmarks/
    # bench_recall.py, BENCHMARKS.md "Recall"): the fixed mode's held-out loss (4.656 vs
    # 4.660 nats, flat to 16x the training length), 1.05-1.14x its step time, and the only
    # TEN that recalls beyond its training length (copy-first trained at 64: 91% at 256).
    selective: Annotated[bool, Doc(
        "input-dependent steps; false: fixed eigenvalues (a time-invariant scan)")] = True
    conv_width: Annotated[int, Range(ge=0), Doc(
        "a causal depthwise convolution of this width before the drive and the step; "
        "0: none")] = 4
    mlp_ratio: Annotated[float, Range(gt=0.0), Doc(
        "feed-forward width over d_model (rounded up to a multiple of 64)")] = 8 / 3
    # |λ| at init is uniform in [lambda_min, lambda_max]: memory spans ~10 to ~1000 tokens
    # from the first step
    lambda_min: Annotated[float, Range(gt=0.0, lt=1.0), Doc(
        "smallest |λ| at initialization")] = 0.9
    lambda_max: Annotated[float, Range(gt=0.0, lt=1.0), Doc(
        "largest |λ| at initialization")] = 0.999
    theta_max: Annotated[float, Doc(
        "eigenvalue angles at initialization are uniform in [0, theta_max]")] = math.pi / 10
    gate_bias: Annotated[float, Doc(
        "the output gate's bias at initialization: σ(-2) = 0.12 (measured better than "
        "0: BENCHMARKS.md)")] = -2.0
    state: Annotated[Literal[STATES], Doc(
        "what an eigenstate holds: vector (a complex number; the layer reads them all "
        "through a fixed projection) or matrix (a complex value vector, written with the "
        "drive as its key and read by a query: linear attention with TEN's eigenvalues; "
        "docs/model.md)")] = "vector"
    value_dim: Annotated[int | None, Range(ge=1), Doc(
        "state: matrix: P, the width of each eigenstate's value vector (per head); null: "
        "d_model / n_heads")] = None

    def __post_init__(self) -> None:
        check_fields(self)
        self._check_fp8()
        if self.n_eigenstates % self.n_heads:
            raise FieldError("n_heads", f"must divide n_eigenstates={self.n_eigenstates}",
                             self.n_heads)
        if self.state == "matrix" and self.value_dim is None and self.d_model % self.n_heads:
            raise FieldError("value_dim", f"state: matrix with n_heads={self.n_heads} not "
                             f"dividing d_model={self.d_model} needs value_dim set")
        if not self.lambda_min < self.lambda_max:
            raise FieldError("lambda_min", f"must be < lambda_max={self.lambda_max}",
                             self.lambda_min)

    @property
    def mlp_hidden(self) -> int:
        return mlp_hidden_size(self.d_model, self.mlp_ratio)

    @property
    def head_value_dim(self) -> int:
        """P: a matrix state's value width per head (value_dim, or d_model / n_heads)."""
        return self.value_dim or self.d_model // self.n_heads


@dataclass(frozen=True)
class TransformerConfig(LMConfig):
    """The baseline: a pre-LN GPT (``ten.model.transformer``); with pos: learned its seq_len is
    the longest it runs."""

    n_heads: Annotated[Count, Doc("attention heads (divide d_model)")] = 2
    mlp_hidden: Annotated[Count, Doc(
        "feed-forward width; a job that does not set it gets the width that matches the "
        "TEN preset's parameter count")] = 384
    pos: Annotated[Literal[POSITIONS], Doc(
        "positions: rope (any length) or a learned table (seq_len at most)")] = "rope"
    rope_base: Annotated[float, Doc("RoPE's frequency base")] = 10000.0

    def __post_init__(self) -> None:
        check_fields(self)
        self._check_fp8()
        if self.d_model % self.n_heads:
            raise FieldError("n_heads", f"must divide d_model={self.d_model}", self.n_heads)
        if self.pos == "rope" and (self.d_model // self.n_heads) % 2:
            raise FieldError("n_heads", f"RoPE needs an even head size (d_model/n_heads = "
                             f"{self.d_model // self.n_heads})", self.n_heads)


# a job's model.arch -> its config
MODEL_CONFIGS: dict[str, type] = {"ten": TENConfig, "transformer": TransformerConfig}
ARCHS = tuple(MODEL_CONFIGS)
