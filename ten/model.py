"""The Temporal Eigenstate Network language model (docs/model.md explains it).

Each layer keeps K complex eigenstates per sequence, split into H heads of K/H:

    β_t  = γ ⊙ W_in · LN(x_t)                       drive, K complex numbers
    c_t  = λ_t ⊙ c_{t-1} + β_t                        the scan (ten.scan)
    c̃_t  = (I + M_h) c_t   per head                   coupling, re and im alike
    y_t  = σ(W_g · LN(x_t) + b_g) ⊙ W_out [Re c̃_t; Im c̃_t]

with λ_k = exp(-exp(ν_k) + iθ_k), so 0 < |λ_k| < 1 whatever ν is, and
γ_k = sqrt(1 - |λ_k|²) keeping the state's variance O(1).

Selective mode gives every eigenstate an input-dependent step (Mamba's discretization):

    Δ_k(t) = softplus(w_k · u_t + b_k) / 0.01 > 0      (u_t: LN(x_t), or its convolution)
    λ_k(t) = exp(Δ_k(t) · (-exp(ν_k) + iθ_k)),   γ_k(t) = sqrt(1 - |λ_k(t)|²)

A small step holds: λ -> 1 and γ -> 0, the state keeps what it has and ignores the
token. A large one overwrites: λ -> 0 and γ -> 1. The rotation scales with the step, so
phase still measures "time" in the eigenstate's own clock. The step starts near 1 (the
fixed model's; b_k = softplus⁻¹(0.01), see STEP_UNIT) and varies with the token (w is
random): with w = 0 the model would start on a saddle, where neither the step nor what
feeds it gets a gradient.

``conv_width`` > 0 puts a short causal convolution (ShortConv) in front of the drive and
the step, so both can depend on the last few tokens, not the current one alone: what
the recall tasks need (benchmarks/bench_recall.py; BENCHMARKS.md "Recall").

There is no position table: the recurrence carries position, so any length runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ten.block_fused import LayerNorm, causal_conv, sigmoid_gate
from ten.config import FieldError
from ten.lm import Block, LanguageModel, check_checkpoint_blocks
from ten.mlp import MLP_KINDS, mlp_hidden_size
from ten.scan import NAMES as BACKEND_NAMES
from ten.scan import scan
from ten.selective import DELTA_BIAS, MIN_WRITE, selective_drive, step_of

State = tuple[Tensor, ...]  # per layer: the (B, 2K) float32 eigenstates (a pair with conv)


@dataclass(frozen=True)
class TENConfig:
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 4
    n_eigenstates: int = 64  # K, complex states per layer
    n_heads: int = 4  # coupling blocks of K/H states
    seq_len: int = 256  # training length (the model itself runs at any length)
    chunk_size: int = 64  # Q for the chunked scan
    scan_backend: str = "auto"  # fused on CUDA, else chunked; or ref | chunked | fused
    # selective + conv_width 4, every preset's mode, by measurement (benchmarks/
    # bench_recall.py, BENCHMARKS.md "Recall"): the fixed mode's held-out loss (4.656 vs
    # 4.660 nats, flat to 16x the training length), 1.05-1.14x its step time, and the only
    # TEN that recalls beyond its training length (copy-first trained at 64: 91% at 256).
    selective: bool = True  # input-dependent steps; False: fixed eigenvalues (an LTI scan)
    conv_width: int = 4  # a causal depthwise convolution of this width before the drive; 0: none
    mlp: str = "swiglu"
    mlp_ratio: float = 8 / 3
    lambda_min: float = 0.9  # |λ| at init is uniform in [lambda_min, lambda_max]:
    lambda_max: float = 0.999  # memory spans ~10 to ~1000 tokens from the first step
    theta_max: float = math.pi / 10  # θ at init is uniform in [0, theta_max]
    gate_bias: float = -2.0  # b_g at init: σ(-2) = 0.12 (measured better than 0: BENCHMARKS.md)
    norm_eps: float = 1e-5
    init_std: float = 0.02
    grad_checkpointing: bool = False
    checkpoint_blocks: int | None = None  # with grad_checkpointing: the first N; None: all

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, what: str) -> None:
            if not ok:
                raise FieldError(field, what, getattr(self, field))

        check_checkpoint_blocks(self)

        for f in ("vocab_size", "d_model", "n_layers", "n_eigenstates", "n_heads", "seq_len",
                  "chunk_size"):
            need(isinstance(getattr(self, f), int) and getattr(self, f) >= 1, f,
                 "must be a positive integer")
        need(isinstance(self.conv_width, int) and self.conv_width >= 0, "conv_width",
             "must be 0 (no convolution) or a positive integer")
        need(self.n_eigenstates % self.n_heads == 0, "n_heads",
             f"must divide n_eigenstates={self.n_eigenstates}")
        need(0.0 < self.lambda_min < self.lambda_max < 1.0, "lambda_min",
             f"need 0 < lambda_min < lambda_max={self.lambda_max} < 1")
        need(self.mlp in MLP_KINDS, "mlp", f"must be one of {MLP_KINDS}")
        need(self.mlp_ratio > 0, "mlp_ratio", "must be > 0")
        # The name only: whether ``fused`` can run is known where the tensors are (a laptop
        # validating a GPU job must accept it); the first scan, or resolve_backend, says.
        need(self.scan_backend in BACKEND_NAMES, "scan_backend",
             f"must be one of {', '.join(BACKEND_NAMES)}")

    @property
    def mlp_hidden(self) -> int:
        return mlp_hidden_size(self.d_model, self.mlp_ratio)


class ShortConv(nn.Module):
    """A causal depthwise convolution over the last ``width`` inputs (Mamba and H3 put one
    before their scans). The drive and the step then see the previous few tokens: a layer
    can write "this token followed that one", and the first positions, padded with zeros,
    look different from the rest, which lets a layer single out the start of a sequence.
    Its state is the last ``width - 1`` inputs."""

    def __init__(self, d_model: int, width: int):
        super().__init__()
        self.width = width
        self.conv = nn.Conv1d(d_model, d_model, width, groups=d_model)  # torch's init

    def forward(self, x: Tensor, tail: Tensor | None) -> tuple[Tensor, Tensor]:
        B, _, d = x.shape
        if tail is None:
            tail = x.new_zeros(B, self.width - 1, d)
        xp = torch.cat([tail.to(x.dtype), x], dim=1)  # (B, W-1+T, d)
        y = causal_conv(xp, self.conv.weight, self.conv.bias)  # on (B, T, d): no transposes
        return y, xp[:, xp.shape[1] - (self.width - 1):]


class EigenstateMixer(nn.Module):
    """One TEN mixing layer: input is the pre-normed x, output goes on the residual."""

    def __init__(self, cfg: TENConfig):
        super().__init__()
        d, K, H = cfg.d_model, cfg.n_eigenstates, cfg.n_heads
        self.cfg = cfg
        self.in_proj = nn.Linear(d, 2 * K, bias=False)
        self.out_proj = nn.Linear(2 * K, d, bias=False)
        self.gate = nn.Linear(d, d)
        self.nu = nn.Parameter(torch.empty(K))  # log decay rate: |λ| = exp(-exp(ν))
        self.theta = nn.Parameter(torch.empty(K))  # rotation per step
        self.coupling = nn.Parameter(torch.empty(H, K // H, K // H))  # M_h in R_h = I + M_h
        self.delta = nn.Linear(d, K) if cfg.selective else None  # Δ_t's pre-activation
        self.conv = ShortConv(d, cfg.conv_width) if cfg.conv_width else None
        self.reset_eigen_parameters()

    def reset_eigen_parameters(self) -> None:
        cfg, K = self.cfg, self.cfg.n_eigenstates
        with torch.no_grad():
            mag = torch.empty_like(self.nu).uniform_(cfg.lambda_min, cfg.lambda_max)
            self.nu.copy_(torch.log(-torch.log(mag)))
            self.theta.uniform_(0.0, cfg.theta_max)
            r = K // cfg.n_heads
            self.coupling.normal_(0.0, 0.01 / math.sqrt(r))
            if self.delta is not None:
                self.delta.weight.normal_(0.0, 1.0 / math.sqrt(cfg.d_model))
                self.delta.bias.fill_(DELTA_BIAS)

    def step(self, xn: Tensor) -> Tensor:
        """Selective mode's Δ_t (B, T, K): at least fp32 (bf16 under autocast), and a
        float64 model stays exact."""
        return step_of(self.delta(xn))

    def eigenvalues(self, xn: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(log λ as [log|λ| | θ], γ as [γ | γ]): both (2K,) fixed, or (B, T, 2K) in
        selective mode (needs xn). -expm1 keeps 1 - |λ|² accurate as |λ| -> 1."""
        rate = torch.exp(self.nu)  # -log|λ| per unit step
        if self.delta is None:
            gamma = torch.sqrt(-torch.expm1(-2.0 * rate))
            return torch.cat([-rate, self.theta]), gamma.repeat(2)
        step = self.step(xn)
        gamma = torch.sqrt((-torch.expm1(-2.0 * rate * step)).clamp_min(MIN_WRITE))
        return (torch.cat([-rate * step, self.theta * step], dim=-1),
                torch.cat([gamma, gamma], dim=-1))

    def drive(self, u: Tensor) -> tuple[Tensor, Tensor]:
        """(log λ, β = γ ⊙ W_in·u) for the scan: β (B, T, 2K); log λ (2K,) fixed or (B, T, 2K)
        selective, where it is ``eigenvalues(u)``'s formula as one operator (ten.selective)."""
        if self.delta is None:
            log_lam, gamma = self.eigenvalues()
            return log_lam, self.in_proj(u) * gamma
        return selective_drive(self.delta(u), self.in_proj(u), self.nu, self.theta)

    def forward(self, xn: Tensor, state: State | Tensor | None) -> tuple[Tensor, Any]:
        """``state``: the eigenstates (B, 2K), and with a convolution the pair
        (eigenstates, the convolution's last inputs (B, conv_width - 1, d))."""
        B, T, _ = xn.shape
        K, H = self.cfg.n_eigenstates, self.cfg.n_heads
        eig, tail = (state, None) if self.conv is None or state is None else state
        u = xn
        if self.conv is not None:
            u, tail = self.conv(xn, tail)
        log_lam, beta = self.drive(u)
        c, eig = scan(beta, log_lam, eig,
                      backend=self.cfg.scan_backend, chunk_size=self.cfg.chunk_size)
        cv = c.view(B, T, 2, H, K // H)  # re/im, heads, states per head
        c = (cv + torch.einsum("btzhs,hrs->btzhr", cv, self.coupling)).reshape(B, T, 2 * K)
        y = sigmoid_gate(self.gate(xn), self.out_proj(c))
        return y, (eig if self.conv is None else (eig, tail))


class TENLM(LanguageModel):
    """Embedding (tied to the head) → blocks → final LayerNorm → logits."""

    def __init__(self, config: TENConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            Block(EigenstateMixer(config), config.d_model, config.mlp_hidden, config.mlp,
                  config.norm_eps) for _ in range(config.n_layers))
        self.norm = LayerNorm(config.d_model, eps=config.norm_eps)
        self._init_weights()

    def _init_weights(self) -> None:
        cfg = self.config
        std = cfg.init_std
        # Projections that write into the residual stream shrink with depth (GPT-2).
        resid_std = std / math.sqrt(2 * cfg.n_layers)
        with torch.no_grad():
            nn.init.normal_(self.embed.weight, 0.0, std)
            for block in self.blocks:
                mixer = block.mixer
                nn.init.normal_(mixer.in_proj.weight, 0.0, std)
                nn.init.normal_(mixer.gate.weight, 0.0, std)
                nn.init.constant_(mixer.gate.bias, cfg.gate_bias)
                nn.init.normal_(mixer.out_proj.weight, 0.0, resid_std)
                nn.init.normal_(block.mlp.up.weight, 0.0, std)
                nn.init.normal_(block.mlp.down.weight, 0.0, resid_std)
                for lin in (block.mlp.up, block.mlp.down):
                    if lin.bias is not None:
                        lin.bias.zero_()

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6 × matmul weights (head included) + 3 × the scan.

        The chunked scan's forward does a dense Q×Q complex matrix-vector product per
        chunk and eigenstate (8·Q real FLOPs per state per token) plus O(K) between
        chunks; backward is counted as twice the forward, as for the matmuls.
        """
        cfg = self.config
        seq_len = cfg.seq_len if seq_len is None else seq_len
        matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        matmul += self.embed.weight.numel()  # the tied LM head
        matmul += sum(2 * b.mixer.coupling.numel() for b in self.blocks)  # re and im
        matmul += sum(b.mixer.conv.conv.weight.numel() for b in self.blocks if b.mixer.conv)
        q = min(cfg.chunk_size, seq_len)
        scan_fwd = cfg.n_layers * (8 * q + 16) * cfg.n_eigenstates
        return 6.0 * matmul + 3.0 * scan_fwd
