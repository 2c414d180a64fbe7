"""The Temporal Eigenstate Network language model (docs/model.md explains it).

Each layer keeps K complex eigenstates per sequence, split into H heads of K/H:

    β_t  = γ ⊙ W_in · LN(x_t)                       drive, K complex numbers
    c_t  = λ_t ⊙ c_{t-1} + β_t                        the scan (ten.kernels.scan)
    c̃_t  = (I + M_h) c_t   per head                   coupling, re and im alike
    y_t  = σ(W_g · LN(x_t) + b_g) ⊙ W_out [Re c̃_t; Im c̃_t]

(in training the coupling is computed folded into the projection: W_out (I + M), one
weight; EigenstateMixer.project).

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

With ``state: matrix`` each eigenstate holds a value vector instead (docs/model.md,
"Eigenstates that hold values"): per head, C_t = λ_t ⊙ C_{t-1} + β_t (W_v u_t)ᵀ read as
Re((W_q u_t)ᴴ C_t), then gated and projected by W_out (ten.kernels.matrix_scan). Its
query and value weights keep torch's Linear initialisation (what BENCHMARKS.md measured).

There is no position table: the recurrence carries position, so any length runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ten.kernels.block_fused import LayerNorm, causal_conv, causal_conv_and_linear, linears
from ten.kernels.matrix_scan import matrix_scan
from ten.kernels.scan import resolve_backend, scan
from ten.kernels.selective import DELTA_BIAS, MIN_WRITE, selective_drive, step_of
from ten.model.config import TENConfig
from ten.model.lm import Block, LanguageModel

State = tuple[Tensor, ...]  # per layer: the (B, 2K) float32 eigenstates (a pair with conv)


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
        """(the convolution of x (B, T, d) after ``tail``, the next tail)."""
        y = causal_conv(x, tail, self.conv.weight, self.conv.bias)  # on (B, T, d)
        return y, self._next_tail(x, tail)

    def with_linear(self, x: Tensor, tail: Tensor | None, linear: nn.Linear
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """(the convolution of x, ``linear(x)``, the next tail), x's gradient from both
        summed in place (``causal_conv_and_linear``): the mixer's gate reads x too."""
        y, g = causal_conv_and_linear(x, tail, self.conv.weight, self.conv.bias, linear)
        return y, g, self._next_tail(x, tail)

    def _next_tail(self, x: Tensor, tail: Tensor | None) -> Tensor:
        """The next chunk's tail: the last W - 1 inputs, some of them this tail's if x is
        shorter."""
        B, T, d = x.shape
        keep = self.width - 1
        if T >= keep:
            return x[:, T - keep:]
        before = x.new_zeros(B, keep, d) if tail is None else tail.to(x.dtype)
        return torch.cat([before, x], dim=1)[:, T:]


def scan_decided(config: TENConfig, device: str | torch.device | None = None) -> TENConfig:
    """``config`` with its scan backend decided for ``device`` (None: torch's default
    device): ``auto`` becomes the backend that runs there; an explicit one is kept, and
    checked where it runs. Once, as the model is built: the scan runs what it is given."""
    if config.scan_backend != "auto":
        return config
    where = torch.get_default_device() if device is None else device
    return dataclasses.replace(config, scan_backend=resolve_backend("auto", where))


class EigenstateMixer(nn.Module):
    """One TEN mixing layer: input is the pre-normed x, output goes on the residual. Its
    scan backend is decided as it is built (:func:`scan_decided`)."""

    def __init__(self, cfg: TENConfig):
        super().__init__()
        d, K, H = cfg.d_model, cfg.n_eigenstates, cfg.n_heads
        self.cfg = cfg = scan_decided(cfg)
        self.in_proj = nn.Linear(d, 2 * K, bias=False)
        self.gate = nn.Linear(d, d)
        self.nu = nn.Parameter(torch.empty(K))  # log decay rate: |λ| = exp(-exp(ν))
        self.theta = nn.Parameter(torch.empty(K))  # rotation per step
        if cfg.state == "vector":
            self.out_proj = nn.Linear(2 * K, d, bias=False)
            self.coupling = nn.Parameter(torch.empty(H, K // H, K // H))  # M_h: R_h = I + M_h
        else:  # value vectors, written with the drive as key and read by a query
            P = cfg.head_value_dim
            self.query = nn.Linear(d, 2 * K, bias=False)
            self.value = nn.Linear(d, H * P, bias=False)
            self.out_proj = nn.Linear(H * P, d, bias=False)
            self.coupling = None
        self.delta = nn.Linear(d, K) if cfg.selective else None  # Δ_t's pre-activation
        self.conv = ShortConv(d, cfg.conv_width) if cfg.conv_width else None
        self.reset_eigen_parameters()

    def reset_eigen_parameters(self) -> None:
        cfg, K = self.cfg, self.cfg.n_eigenstates
        with torch.no_grad():
            mag = torch.empty_like(self.nu).uniform_(cfg.lambda_min, cfg.lambda_max)
            self.nu.copy_(torch.log(-torch.log(mag)))
            self.theta.uniform_(0.0, cfg.theta_max)
            if self.coupling is not None:
                self.coupling.normal_(0.0, 0.01 / math.sqrt(K // cfg.n_heads))
            if self.delta is not None:
                self.delta.weight.normal_(0.0, 1.0 / math.sqrt(cfg.d_model))
                self.delta.bias.fill_(DELTA_BIAS)

    def step(self, xn: Tensor) -> Tensor:
        """Selective mode's Δ_t (B, T, K): at least fp32 (bf16 under autocast), and a
        float64 model stays exact."""
        return step_of(self.delta(xn))

    def steps_from_start(self, xn: Tensor) -> Tensor:
        """Selective mode's Δ_t (B, T, K) as :meth:`forward` takes them for the layer input
        xn from a sequence's start (after the convolution, if any). ten.model.statehealth
        reports them."""
        return self.step(xn if self.conv is None else self.conv(xn, None)[0])

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
        selective, where it is ``eigenvalues(u)``'s formula as one operator (ten.kernels.selective)
        on u's two projections, W_in·u and the step's, computed as one."""
        if self.delta is None or self.many_tokens(u):  # drive_weight: one matmul
            return self.drive_from(F.linear(u, self.drive_weight()))
        # a few tokens: their two projections stacked, not the weights
        return self.drive_from(torch.cat([self.in_proj(u), F.linear(u, self.delta.weight)],
                                         dim=-1))

    def drive_weight(self) -> Tensor:
        """The drive's projection weight: W_in (2K, d), or [W_in; W_Δ] (3K, d) selective."""
        if self.delta is None:
            return self.in_proj.weight
        return torch.cat([self.in_proj.weight, self.delta.weight])

    def drive_from(self, p: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`drive` of u from u's projection by :meth:`drive_weight`."""
        if self.delta is None:
            log_lam, gamma = self.eigenvalues()
            return log_lam, p * gamma
        return selective_drive(p, self.delta.bias, self.nu, self.theta)

    def matrix_inputs(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(log λ, β, the values W_v·u, the queries W_q·u) of the matrix state. For many
        tokens the three projections of u are ``linears``: one d u, not three that autograd
        sums (of the flagship's micro-batch, 12.9 GB)."""
        if self.many_tokens(u):
            p, v, q = linears(u, self.drive_weight(), self.value.weight, self.query.weight)
            return (*self.drive_from(p), v, q)
        return (*self.drive(u), self.value(u), self.query(u))

    def many_tokens(self, x: Tensor) -> bool:
        """Whether x (B, T, ·) holds at least d tokens: then work on a (·, d) weight once
        (stacking the drive's weights, folding the coupling into W_out) costs no more than
        the same per token (generation, a token at a time, holds fewer)."""
        return x.shape[0] * x.shape[1] >= self.cfg.d_model

    def forward(self, xn: Tensor, state: State | Tensor | None
                ) -> tuple[Tensor, Tensor, Any]:
        """(o, g, state): the mixer's output is σ(g)·o, and the block's next norm applies
        the gate as it adds it to the stream (``LayerNorm.add``: σ(g)·o is never written).
        ``state``: the eigenstates (B, 2K) (a matrix state's: (B, H, K/H, P) complex), and
        with a convolution the pair (eigenstates, the convolution's last inputs
        (B, conv_width - 1, d))."""
        eig, tail = (state, None) if self.conv is None or state is None else state
        if self.conv is None:
            u, g = xn, self.gate(xn)
        else:  # xn's two readers, the convolution and the gate, in one
            u, g, tail = self.conv.with_linear(xn, tail, self.gate)
        if self.cfg.state == "matrix":  # β is the key of a value vector, read by a query
            log_lam, beta, v, q = self.matrix_inputs(u)
            read, eig = matrix_scan(beta, v, q, log_lam, eig,
                                    heads=self.cfg.n_heads, backend=self.cfg.scan_backend,
                                    chunk_size=self.cfg.chunk_size)
            o = self.out_proj(read.to(g.dtype))
        else:
            log_lam, beta = self.drive(u)
            c, eig = scan(beta, log_lam, eig,
                          backend=self.cfg.scan_backend, chunk_size=self.cfg.chunk_size)
            o = self.project(c)
        return o, g, (eig if self.conv is None else (eig, tail))

    def project(self, c: Tensor) -> Tensor:
        """W_out c̃_t for the states c (B, T, 2K), c̃_t = (I + M_h) c_t per head (re and im
        alike). The coupling costs (d × 2K) × K/H multiply-adds folded into the weight
        (:meth:`coupled_out_weight`), 2K × K/H per token on the states: folded for a
        batch of at least d tokens (training: nothing at (B, T, 2K) between the scan and
        the projection to write, read and differentiate), on the states for fewer
        (generation's token at a time)."""
        if self.many_tokens(c):
            return F.linear(c, self.coupled_out_weight())
        B, T, _ = c.shape
        K, H = self.cfg.n_eigenstates, self.cfg.n_heads
        cv = c.view(B, T, 2, H, K // H)  # re/im, heads, states per head
        coupled = cv + torch.einsum("btzhs,hrs->btzhr", cv, self.coupling)
        return self.out_proj(coupled.reshape(B, T, 2 * K))

    def coupled_out_weight(self) -> Tensor:
        """W_out (I + M_h): the output projection of the coupled states folded into one
        (d, 2K) weight, in the parameters' dtype (see :meth:`project`)."""
        d, K, H = self.cfg.d_model, self.cfg.n_eigenstates, self.cfg.n_heads
        w = self.out_proj.weight
        with torch.autocast(w.device.type, enabled=False):  # a weight: at its own precision
            wv = w.view(d, 2, H, K // H)  # (d, re/im, head, state)
            return (wv + torch.einsum("dzhr,hrs->dzhs", wv, self.coupling)).reshape(d, 2 * K)


class TENLM(LanguageModel):
    """Embedding (tied to the head) → blocks → final LayerNorm → logits. Built for torch's
    default device (its scan backend decided there: :func:`scan_decided`);
    ``ten.model.presets.build_model(config, device)`` builds one for another."""

    def __init__(self, config: TENConfig):
        super().__init__()
        self.config = config = scan_decided(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            Block(EigenstateMixer(config), config) for _ in range(config.n_layers))
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

        The heads' coupling is folded into the output projection's weight once per forward
        in training (:meth:`EigenstateMixer.project`): no work per token. The chunked scan's
        forward does a dense Q×Q complex matrix-vector product per chunk and eigenstate
        (8·Q real FLOPs per state per token) plus O(K) between chunks. A matrix state's
        does, per head of N = K/H eigenstates and P values: the Q scores of a token
        (8·Q·N, complex), their mix of real values (2·Q·P) and the state's read and
        write (8·N·P each). Backward is counted as twice the forward, as for the matmuls.
        """
        cfg = self.config
        seq_len = cfg.seq_len if seq_len is None else seq_len
        matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        matmul += self.embed.weight.numel()  # the tied LM head
        matmul += sum(b.mixer.conv.conv.weight.numel() for b in self.blocks if b.mixer.conv)
        q = min(cfg.chunk_size, seq_len)
        if cfg.state == "vector":
            scan_fwd = cfg.n_layers * (8 * q + 16) * cfg.n_eigenstates
        else:
            N, P = cfg.n_eigenstates // cfg.n_heads, cfg.head_value_dim
            scan_fwd = cfg.n_layers * cfg.n_heads * (8 * q * N + 2 * q * P + 16 * N * P)
        return 6.0 * matmul + 3.0 * scan_fwd
