"""The baseline: a pre-LN GPT with the same interface as the TEN model.

It exists so that every speed and quality claim about TEN is an A/B on the same data,
tokens and trainer. Attention is ``scaled_dot_product_attention`` (FlashAttention on
GPU); positions are RoPE (any length) or a learned table (fixed maximum length).
The carried ``state`` is the key/value cache, so generation and chunked evaluation use
the same ``forward(ids, state)`` call as TEN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ten.kernels.block_fused import LayerNorm
from ten.model.config import TransformerConfig
from ten.model.lm import Block, LanguageModel

KVCache = tuple[tuple[Tensor, Tensor], ...]  # per layer: keys, values (B, H, T_past, hd)


def rope(x: Tensor, offset: int, base: float) -> Tensor:
    """Rotate pairs (x[..., :h/2], x[..., h/2:]) of (B, H, T, hd) by position·frequency."""
    T, hd = x.shape[-2], x.shape[-1]
    inv_freq = base ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    pos = torch.arange(offset, offset + T, device=x.device, dtype=torch.float32)
    angles = pos[:, None] * inv_freq[None, :]  # (T, hd/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(
        self, xn: Tensor, cache: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, None, tuple[Tensor, Tensor]]:
        """(output, no gate, the key/value cache): a block's mixer, as ``ten.model.lm.Block``
        calls it."""
        B, T, d = xn.shape
        H = self.cfg.n_heads
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in self.qkv(xn).split(d, -1))
        past = 0 if cache is None else cache[0].shape[2]
        if self.cfg.pos == "rope":
            q, k = rope(q, past, self.cfg.rope_base), rope(k, past, self.cfg.rope_base)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        if past == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:  # one new token sees the whole cache
            out = F.scaled_dot_product_attention(q, k, v)
        else:  # is_causal aligns top-left; with a cache the diagonal is shifted by `past`
            mask = torch.ones(T, past + T, dtype=torch.bool, device=xn.device).tril(past)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(B, T, d)
        return self.proj(out), None, (k, v)


class TransformerLM(LanguageModel):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = (nn.Embedding(config.seq_len, config.d_model)
                          if config.pos == "learned" else None)
        self.blocks = nn.ModuleList(
            Block(Attention(config), config) for _ in range(config.n_layers))
        self.norm = LayerNorm(config.d_model, eps=config.norm_eps)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.config.init_std
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() < 2:
                    continue  # LayerNorm defaults, zero biases
                is_resid = name.endswith(("mixer.proj.weight", "mlp.down.weight"))
                nn.init.normal_(p, 0.0, resid_std if is_resid else std)
            for block in self.blocks:
                for lin in (block.mlp.up, block.mlp.down):
                    if lin.bias is not None:
                        lin.bias.zero_()

    # forward(ids, state) -> (logits, caches) and hidden_states come from LanguageModel:
    # embed_tokens → run_blocks → norm → the tied head.

    def embed_tokens(self, ids: Tensor, state: KVCache | None) -> Tensor:
        """Token embeddings, plus the learned position table (RoPE acts in attention)."""
        T = ids.shape[1]
        past = 0 if state is None else state[0][0].shape[2]
        x = self.embed(ids)  # (B, T, d)
        if self.pos_embed is not None:
            if past + T > self.config.seq_len:
                raise ValueError(
                    f"learned positions cover {self.config.seq_len} tokens, got {past + T}; "
                    "use pos: rope to run longer inputs")
            x = x + self.pos_embed(torch.arange(past, past + T, device=ids.device))
        return x

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6 × matmul weights (head included) + causal attention.

        Causal attention computes about half of the T×T scores: per token and layer
        2·d·T FLOPs forward for QKᵀ and AV together, ×3 for training.
        """
        cfg = self.config
        seq_len = cfg.seq_len if seq_len is None else seq_len
        matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        matmul += self.embed.weight.numel()
        return 6.0 * matmul + 6.0 * cfg.n_layers * cfg.d_model * seq_len
