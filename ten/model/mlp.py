"""The position-wise feed-forward block shared by both architectures."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ten.kernels.block_fused import swiglu_down
from ten.model.config import MLP_KINDS


class MLP(nn.Module):
    """SwiGLU (``down(silu(a) * b)``, no biases) or GELU (``down(gelu(up(x)))``)."""

    def __init__(self, d_model: int, hidden: int, kind: str = "swiglu"):
        super().__init__()
        if kind not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {kind!r}")
        self.kind = kind
        if kind == "swiglu":
            self.up = nn.Linear(d_model, 2 * hidden, bias=False)
            self.down = nn.Linear(hidden, d_model, bias=False)
        else:
            self.up = nn.Linear(d_model, hidden)
            self.down = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, d) -> (B, T, d)
        if self.kind == "swiglu":  # keeps up(x) for backward, not silu(a)·b
            return swiglu_down(self.up(x), self.down.weight)
        return self.down(F.gelu(self.up(x)))
