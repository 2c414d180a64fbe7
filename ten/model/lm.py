"""What every language model in ``ten`` shares: the interface the trainer relies on.

    forward(ids (B, T), state=None) -> (logits (B, T, V), state)
    hidden_states(ids, state=None) -> (h (B, T, d), state)    logits = h @ output_weight.T

``state`` is whatever the architecture carries between calls (TEN: one fixed-size
eigenstate per layer; transformer: a growing key/value cache). Feeding a sequence in
pieces with the returned state gives the same logits as feeding it whole, which is
what generation and long-document evaluation build on. Training never asks for the
logits: it takes the hidden states and the head's weight to a loss that never holds the
whole B×T×V (ten.kernels.loss).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ten.kernels.block_fused import LayerNorm
from ten.model.config import LMConfig
from ten.model.mlp import MLP


def recomputed_blocks(config: Any) -> int:
    """How many blocks, from the first, recompute their forward in backward: every one
    with ``grad_checkpointing``, or its first ``checkpoint_blocks``. Each checkpointed
    block trades its saved activations (about 0.9 GB per 32K tokens for the flagship's
    blocks, traced with the fused scan) for a second forward; the rest run at full
    speed."""
    if not config.grad_checkpointing:
        return 0
    n = config.n_layers if config.checkpoint_blocks is None else config.checkpoint_blocks
    return min(n, config.n_layers)


class Block(nn.Module):
    """Pre-LN residual block: ``x + mixer(LN(x))``, then ``x + MLP(LN(x))``.

    The mixer (TEN eigenstates, or attention) is the only part that looks across time,
    and the only part with state to carry between calls.

    Each residual add happens in the norm after it (``LayerNorm.add``: the sum and its
    norm in one pass), so a block takes and returns the stream with its last output not
    yet added: ``(x, pending)``; the next block's first norm, or the model's final one,
    adds it. A mixer returns ``(o, gate, state)``: its output is σ(gate)·o (TEN's output
    gate), or o itself for a gate of None (attention), and the norm after it applies the
    gate in the same pass.
    """

    def __init__(self, mixer: nn.Module, config: LMConfig):
        super().__init__()
        d, eps = config.d_model, config.norm_eps
        self.norm1 = LayerNorm(d, eps=eps)
        self.mixer = mixer
        self.norm2 = LayerNorm(d, eps=eps)
        self.mlp = MLP(d, config.mlp_hidden, config.mlp, config.fp8)

    def forward(self, x: Tensor, pending: Tensor, state: Any
                ) -> tuple[Tensor, Tensor, Any]:
        """(x, pending) -> (x + pending + mixer's output, this block's MLP output, state)."""
        x, xn = self.norm1.add(x, pending)
        o, gate, state = self.mixer(xn, state)
        fp8 = self.mlp.input_scale_for
        if fp8 is not None:  # the norm takes the float8 block's input scale as it writes it
            x, xn, scale = self.norm2.add_with_scale(x, o, fp8, gate)
            return x, self.mlp(xn, scale), state
        x, xn = self.norm2.add(x, o, gate)
        return x, self.mlp(xn), state


class LanguageModel(nn.Module):
    """Base class: parameter groups, counting and sampling shared by all architectures."""

    config: Any
    blocks_compiled = False  # compile_blocks sets it: run_blocks then feeds the first block zeros

    def forward(self, ids: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """ids (B, T) → logits (B, T, V) and the state after the last token."""
        h, state = self.hidden_states(ids, state)
        return F.linear(h, self.output_weight), state

    # --- the head's input and weight (what ten.kernels.loss needs) --------------------------------

    def embed_tokens(self, ids: Tensor, state: Any) -> Tensor:
        """ids (B, T) → the blocks' input (B, T, d); positional models add positions here."""
        return self.embed(ids)

    def hidden_states(self, ids: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """ids (B, T) → the final-normed hidden states (B, T, d) the head reads, and the
        state: ``forward``'s logits are ``F.linear(h, output_weight)``."""
        x = self.to_stream(self.embed_tokens(ids, state))
        x, pending, new_state = self.run_blocks(x, state)
        return self.norm.add(x, pending)[1], new_state

    def to_stream(self, x: Tensor) -> Tensor:
        """The blocks' input x in the residual stream's dtype: bf16 under bf16 autocast
        when ``config.residual_dtype`` is bf16 (every sum after it stays bf16: the fused
        norms add in fp32 and store in their inputs' dtype), else as it is."""
        dev = x.device.type
        if self.config.residual_dtype == "bf16" and torch.is_autocast_enabled(dev) and \
                torch.get_autocast_dtype(dev) == torch.bfloat16:
            return x.to(torch.bfloat16)
        return x

    @property
    def output_weight(self) -> Tensor:
        """The LM head's (V, d) weight: the embedding table (tied)."""
        return self.embed.weight

    def compile_blocks(self, **options: Any) -> None:
        """``torch.compile`` every block in place (regional compilation), with ``options``
        for ``torch.compile``: the blocks share one compiled graph (one more for
        evaluation), parameters are its inputs, and state_dict keys do not change."""
        for block in self.blocks:
            block.compile(**options)
        self.blocks_compiled = True

    def run_blocks(self, x: Tensor, state: Any) -> tuple[Tensor, Tensor, tuple[Any, ...]]:
        """x (B, T, d) through ``self.blocks``, each with its own carried state: the stream
        and the last block's output still to add to it (see :class:`Block`). The first
        :func:`recomputed_blocks` blocks keep only their inputs for backward and run their
        forward again there (gradient checkpointing)."""
        if state is not None and len(state) != len(self.blocks):
            raise ValueError(f"state has {len(state)} layers, model has {len(self.blocks)}")
        training = self.training and torch.is_grad_enabled()
        recomputed = recomputed_blocks(self.config) if training else 0
        # The first block has no predecessor's output to add: None, and its first norm
        # norms x alone. Compiled blocks get zeros there instead, in x's place in autograd
        # (x * 0, not a constant): the blocks' arguments then match in kind and in
        # requires_grad, which torch.compile's guards check, so they share one graph (a
        # None compiled the first on its own). Eager, the zeros cost a flagship micro-batch
        # ~1.9 GB of traffic: their product, the sum's extra pass and their gradients.
        new_state, pending = [], (x * 0 if self.blocks_compiled else None)
        for i, block in enumerate(self.blocks):
            s = None if state is None else state[i]
            if i < recomputed:
                x, pending, s = checkpoint(block, x, pending, s, use_reentrant=False)
            else:
                x, pending, s = block(x, pending, s)
            new_state.append(s)
        return x, pending, tuple(new_state)

    # --- optimizer support ----------------------------------------------------------------

    def no_weight_decay(self) -> set[str]:
        """Names of parameters that must not be weight-decayed.

        Every vector (norm gains and biases, eigenvalue decay/frequency parameters) and
        every embedding table. Decaying ν (|λ| = exp(-exp(ν))) would pull every |λ|
        towards e^-1, memories of about one token, and θ towards 0, for no reason but the
        regulariser: the public reference implementation did that.
        """
        names = {name for name, p in self.named_parameters() if p.dim() < 2}
        for mod_name, module in self.named_modules():
            if isinstance(module, nn.Embedding):
                names.add(f"{mod_name}.weight" if mod_name else "weight")
        return names

    def optimizer_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Two AdamW parameter groups: decayed matrices and the no-decay set."""
        skip = self.no_weight_decay()
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if p.requires_grad:
                (no_decay if name in skip else decay).append(p)
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]

    # --- counting ---------------------------------------------------------------------

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Parameter count; the tied embedding/head is counted once."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Embedding))
        return total

    def flops_per_token(self, seq_len: int) -> float:  # pragma: no cover
        """Training FLOPs (forward + backward) per token at this sequence length; the head
        counts as 6·V·d (its forward 2·V·d, backward twice that)."""
        raise NotImplementedError

    def recompute_flops_per_token(self, seq_len: int) -> float:
        """FLOPs per token run again in backward (for HFU, not MFU): each recomputed
        block's forward, a third of its training FLOPs (the head and the loss are not
        checkpointed), so such a block costs 4× its forward instead of 3×. 0 without
        checkpointing."""
        head = 6.0 * self.output_weight.numel()
        blocks = self.flops_per_token(seq_len) - head
        return blocks / 3.0 * recomputed_blocks(self.config) / len(self.blocks)

    # --- generation -------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue ``prompt_ids`` (B, P) by ``max_new_tokens`` tokens; returns (B, P + new).

        The prompt is read in one forward pass; every new token then costs one
        single-token forward with the carried state. ``temperature=0`` is greedy.
        """
        if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
            shape = tuple(prompt_ids.shape)
            raise ValueError(f"prompt_ids must be (B, P) with P >= 1, got {shape}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        was_training = self.training
        self.eval()
        try:
            logits, state = self(prompt_ids)
            tokens = [prompt_ids]
            for i in range(max_new_tokens):
                nxt = sample_next(logits[:, -1], temperature, top_k, generator)  # (B, 1)
                tokens.append(nxt)
                if i + 1 < max_new_tokens:
                    logits, state = self(nxt, state)
            return torch.cat(tokens, dim=1)
        finally:
            self.train(was_training)


def sample_next(
    logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> Tensor:
    """Pick one token per row from (B, V) logits: greedy, or top-k sampling at a temperature."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)
