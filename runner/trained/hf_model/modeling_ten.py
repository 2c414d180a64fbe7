"""A Temporal Eigenstate Network language model in plain torch, for ``transformers``
(``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``), as exported
by ten-runner. It computes what the trainer's model computes (the export's tests hold the
logits to it) with a scan written for clarity and any device: chunks of ``chunk_size``
tokens as dense decay matrices, their boundaries carried in a loop.

Each layer keeps K complex eigenstates c per sequence, in H heads of K/H::

    c_t = λ_t ⊙ c_{t-1} + β_t,      β_t = γ_t ⊙ W_in·u_t,      λ_t = exp(Δ_t·(-exp(ν) + iθ))
    y_t = σ(W_g·x̂_t + b_g) ⊙ W_out·[Re c̃_t; Im c̃_t],        c̃ = (I + M_h) c per head

with x̂ = LayerNorm(x), u = x̂ or its short causal convolution, γ = sqrt(1 - |λ|²), and
the step Δ = softplus(W_Δ·u + b_Δ)/0.01 in selective mode (1 otherwise). With
``state: matrix`` each eigenstate holds a value vector instead, written with β as its key
and read by a query: C_t = λ_t ⊙ C_{t-1} + β_t (W_v·u_t)ᵀ, y_t = σ(W_g·x̂_t + b_g) ⊙
W_out·Re((W_q·u_t)ᴴ C_t) per head. Generation
carries every layer's state (the eigenstates, and the convolution's last inputs), so a
new token costs the same however long the text before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

try:  # the folder's own configuration module, as transformers loads it
    from .configuration_ten import TENConfig
except ImportError:  # imported as a plain module (the exporter's tests)
    from configuration_ten import TENConfig

STEP_UNIT = 0.01  # Δ = softplus(z) / STEP_UNIT
MIN_WRITE = 1e-24  # 1 - |λ|² is floored here


def scan(beta: Tensor, log_lam: Tensor, state: Tensor | None, chunk: int
         ) -> tuple[Tensor, Tensor]:
    """c_t = λ_t c_{t-1} + β_t on [re | im] tensors: β (B, T, 2K), log λ (2K,) or
    (B, T, 2K) as [log|λ| | θ], state (B, 2K) or None. Returns every c_t (B, T, 2K) and
    the last, in float32. Inside a chunk c_j = Σ_{s≤j} exp(A_j - A_s) β_s + exp(A_j) c_prev,
    with A the running sum of log λ (float64: the differences of two long sums)."""
    B, T, K2 = beta.shape
    K = K2 // 2
    b = torch.complex(beta[..., :K].float(), beta[..., K:].float())
    a = log_lam.expand(B, T, K2) if log_lam.dim() == 1 else log_lam
    a = torch.complex(a[..., :K].double(), a[..., K:].double())
    s = (b.new_zeros(B, K) if state is None
         else torch.complex(state[:, :K].float(), state[:, K:].float()))
    outs = []
    for start in range(0, T, chunk):
        acc = a[:, start:start + chunk].cumsum(1)  # (B, Q, K)
        q = acc.shape[1]
        causal = torch.ones(q, q, dtype=torch.bool, device=beta.device).tril()[None, :, :, None]
        gap = acc[:, :, None] - acc[:, None, :]  # (B, Q_j, Q_s, K): A_j - A_s
        gap = torch.where(causal, gap, torch.full_like(gap, float("-inf")))
        c = torch.einsum("bjsk,bsk->bjk", torch.exp(gap).to(b.dtype), b[:, start:start + q])
        c = c + torch.exp(acc).to(b.dtype) * s[:, None]
        s = c[:, -1]
        outs.append(c)
    c = torch.cat(outs, dim=1) if outs else b
    return torch.cat([c.real, c.imag], dim=-1), torch.cat([s.real, s.imag], dim=-1)


def matrix_scan(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, state: Tensor | None,
                heads: int, chunk: int) -> tuple[Tensor, Tensor]:
    """A matrix state's recurrence, per head of N eigenstates holding P values:
    C_t = λ_t ⊙ C_{t-1} + k_t v_tᵀ, read as y_t = Re(q_tᴴ C_t). k, q (B, T, 2K) and
    log λ as in :func:`scan`, v (B, T, H·P), state (B, H, N, P) complex or None. Returns
    y (B, T, H·P) and the last state, in float32. Inside a chunk
    y_j = Re Σ_{s≤j} (q_jᴴ (exp(A_j - A_s) ⊙ k_s)) v_s + Re q_jᴴ (exp(A_j) ⊙ C_prev)."""
    B, T, K2 = k.shape
    K = K2 // 2

    def heads_of(x: Tensor, dtype: torch.dtype) -> Tensor:  # -> (B, H, T, N) complex
        c = torch.complex(x[..., :K].to(dtype), x[..., K:].to(dtype))
        return c.view(B, T, heads, K // heads).transpose(1, 2)

    kc, qc = heads_of(k, torch.float32), heads_of(q, torch.float32).conj()
    a = heads_of(log_lam.expand(B, T, K2) if log_lam.dim() == 1 else log_lam, torch.float64)
    vh = v.float().view(B, T, heads, -1).transpose(1, 2)  # (B, H, T, P)
    C = (kc.new_zeros(B, heads, K // heads, vh.shape[-1]) if state is None
         else state.to(kc.dtype))
    outs = []
    for start in range(0, T, chunk):
        acc = a[:, :, start:start + chunk].cumsum(2)  # (B, H, Q, N)
        n = acc.shape[2]
        causal = torch.ones(n, n, dtype=torch.bool, device=k.device).tril()[:, :, None]
        gap = acc[:, :, :, None] - acc[:, :, None, :]  # (B, H, Q_j, Q_s, N): A_j - A_s
        gap = torch.where(causal, gap, torch.full_like(gap, float("-inf")))
        decay = torch.exp(gap).to(kc.dtype)
        qs, ks, vs = qc[:, :, start:start + n], kc[:, :, start:start + n], vh[:, :, start:start + n]
        scores = torch.einsum("bhjn,bhjsn,bhsn->bhjs", qs, decay, ks).real
        y = scores @ vs + torch.einsum("bhjn,bhnp->bhjp", qs * torch.exp(acc).to(kc.dtype),
                                       C).real
        to_end = torch.exp(acc[:, :, -1:] - acc).to(kc.dtype)
        C = (torch.exp(acc[:, :, -1]).to(kc.dtype)[..., None] * C
             + torch.einsum("bhsn,bhsp->bhnp", to_end * ks, vs.to(kc.dtype)))
        outs.append(y)
    y = torch.cat(outs, dim=2) if outs else vh
    return y.transpose(1, 2).reshape(B, T, -1), C


class ShortConv(nn.Module):
    """A causal depthwise convolution over the last ``width`` inputs; its state is the
    last ``width - 1`` of them."""

    def __init__(self, d_model: int, width: int):
        super().__init__()
        self.width = width
        self.conv = nn.Conv1d(d_model, d_model, width, groups=d_model)

    def forward(self, x: Tensor, tail: Tensor | None) -> tuple[Tensor, Tensor]:
        if tail is None:
            tail = x.new_zeros(x.shape[0], self.width - 1, x.shape[2])
        xp = torch.cat([tail.to(x.dtype), x], dim=1)
        y = self.conv(xp.transpose(1, 2)).transpose(1, 2)
        return y, xp[:, xp.shape[1] - (self.width - 1):]


class EigenstateMixer(nn.Module):
    def __init__(self, cfg: TENConfig):
        super().__init__()
        d, K, H = cfg.d_model, cfg.n_eigenstates, cfg.n_heads
        self.cfg = cfg
        self.in_proj = nn.Linear(d, 2 * K, bias=False)
        self.gate = nn.Linear(d, d)
        self.nu = nn.Parameter(torch.zeros(K))
        self.theta = nn.Parameter(torch.zeros(K))
        if cfg.state == "matrix":  # value vectors, read by a query
            self.query = nn.Linear(d, 2 * K, bias=False)
            self.value = nn.Linear(d, H * cfg.value_dim, bias=False)
            self.out_proj = nn.Linear(H * cfg.value_dim, d, bias=False)
            self.coupling = None
        else:
            self.out_proj = nn.Linear(2 * K, d, bias=False)
            self.coupling = nn.Parameter(torch.zeros(H, K // H, K // H))
        self.delta = nn.Linear(d, K) if cfg.selective else None
        self.conv = ShortConv(d, cfg.conv_width) if cfg.conv_width else None

    def drive(self, u: Tensor) -> tuple[Tensor, Tensor]:
        """(log λ as [log|λ| | θ], β): fixed (2K,) or selective (B, T, 2K) eigenvalues."""
        rate = torch.exp(self.nu.float())
        p = self.in_proj(u).float()
        if self.delta is None:
            gamma = torch.sqrt(-torch.expm1(-2.0 * rate))
            return torch.cat([-rate, self.theta.float()]), p * gamma.repeat(2)
        step = F.softplus(self.delta(u).float()) / STEP_UNIT
        gamma = torch.sqrt((-torch.expm1(-2.0 * rate * step)).clamp_min(MIN_WRITE))
        log_lam = torch.cat([-rate * step, self.theta.float() * step], dim=-1)
        return log_lam, p * torch.cat([gamma, gamma], dim=-1)

    def forward(self, xn: Tensor, state: tuple | None) -> tuple[Tensor, tuple]:
        B, T, _ = xn.shape
        K, H = self.cfg.n_eigenstates, self.cfg.n_heads
        eig, tail = state if state is not None else (None, None)
        u = xn
        if self.conv is not None:
            u, tail = self.conv(xn, tail)
        log_lam, beta = self.drive(u)
        if self.coupling is None:
            read, eig = matrix_scan(beta, self.value(u), self.query(u), log_lam, eig, H,
                                    self.cfg.chunk_size)
            y = torch.sigmoid(self.gate(xn)) * self.out_proj(read.to(xn.dtype))
            return y, (eig, tail)
        c, eig = scan(beta, log_lam, eig, self.cfg.chunk_size)
        cv = c.view(B, T, 2, H, K // H)
        c = (cv + torch.einsum("btzhs,hrs->btzhr", cv, self.coupling.float())).reshape(B, T, 2 * K)
        y = torch.sigmoid(self.gate(xn)) * self.out_proj(c.to(xn.dtype))
        return y, (eig, tail)


class MLP(nn.Module):
    def __init__(self, cfg: TENConfig):
        super().__init__()
        self.kind = cfg.mlp
        d, hidden = cfg.d_model, cfg.mlp_hidden
        swiglu = cfg.mlp == "swiglu"
        self.up = nn.Linear(d, 2 * hidden if swiglu else hidden, bias=not swiglu)
        self.down = nn.Linear(hidden, d, bias=not swiglu)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.kind == "swiglu":
            a, b = h.chunk(2, dim=-1)
            return self.down(F.silu(a) * b)
        return self.down(F.gelu(h))


class Block(nn.Module):
    """``x + mixer(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, cfg: TENConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mixer = EigenstateMixer(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, state: tuple | None) -> tuple[Tensor, tuple]:
        y, state = self.mixer(self.norm1(x), state)
        x = x + y
        return x + self.mlp(self.norm2(x)), state


@dataclass
class TENCausalLMOutput(ModelOutput):
    """``state``: per layer (eigenstates (B, 2K), the convolution's last inputs or None),
    what the next call continues from (``generate`` carries it)."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    state: tuple | None = None


class TENForCausalLM(PreTrainedModel, GenerationMixin):
    """Embedding (tied to the head) → blocks → LayerNorm → logits. ``attention_mask`` is
    accepted and ignored: the model is causal and padding on the right is harmless;
    left-padded batches are not supported (run such prompts one at a time)."""

    config_class = TENConfig
    base_model_prefix = "ten"
    _no_split_modules = ["Block"]

    def __init__(self, config: TENConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed = value

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                state: tuple | None = None, labels: Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> TENCausalLMOutput | tuple:
        x = self.embed(input_ids)
        new_state = []
        for i, block in enumerate(self.blocks):
            x, s = block(x, None if state is None else state[i])
            new_state.append(s)
        logits = F.linear(self.norm(x), self.embed.weight).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        out = TENCausalLMOutput(loss=loss, logits=logits, state=tuple(new_state))
        return out if return_dict is not False else out.to_tuple()

    # -- generation: the carried state instead of a key/value cache -------------------
    def prepare_inputs_for_generation(self, input_ids: Tensor, state: tuple | None = None,
                                      **kwargs) -> dict:
        if state is not None:  # everything before the last token is in the state
            input_ids = input_ids[:, -1:]
        return {"input_ids": input_ids, "state": state}

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs,
                                                                   *args, **kwargs)
        model_kwargs["state"] = outputs.state
        return model_kwargs
