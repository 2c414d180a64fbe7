"""The position-wise feed-forward block shared by both architectures."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ten.kernels.block_fused import float8_swiglu, swiglu_down
from ten.kernels.fp8 import E4M3, Float8Gemms, fp8_linear
from ten.model.config import MLP_KINDS


class MLP(nn.Module):
    """SwiGLU (``down(silu(a) * b)``, no biases) or GELU (``down(gelu(up(x)))``); with
    ``fp8`` a scaling of ten.kernels.fp8 (not "off") both projections' GEMMs in float8."""

    def __init__(self, d_model: int, hidden: int, kind: str = "swiglu", fp8: str = "off"):
        super().__init__()
        if kind not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {kind!r}")
        self.kind = kind
        self.gemms = None if fp8 == "off" else Float8Gemms(fp8)
        if kind == "swiglu":
            self.up = nn.Linear(d_model, 2 * hidden, bias=False)
            self.down = nn.Linear(hidden, d_model, bias=False)
        else:
            self.up = nn.Linear(d_model, hidden)
            self.down = nn.Linear(hidden, d_model)
        # the float8 SwiGLU block under one scale a tensor takes x's e4m3 scale from the
        # norm that writes x (ten.model.lm.Block asks for it): None where nothing does
        takes_scale = kind == "swiglu" and self.gemms is not None and self.gemms.per_tensor
        self.input_scale_for = E4M3 if takes_scale else None

    def forward(self, x: Tensor, x_scale: Tensor | None = None) -> Tensor:  # (B, T, d) -> same
        """``x_scale``: x's one float8 scale for :attr:`input_scale_for`, where the norm that
        wrote x took it (ten.kernels.block_fused.add_layer_norm_with_scale)."""
        if self.kind == "swiglu" and self.gemms is not None:
            return float8_swiglu(x, self.up.weight, self.down.weight, self.gemms, x_scale)
        if x_scale is not None:
            raise ValueError("MLP: an input scale is taken by the float8 SwiGLU block under "
                             "one scale a tensor only")
        if self.kind == "swiglu":  # keeps up(x) for backward, not silu(a)·b
            return swiglu_down(self.up(x), self.down.weight)
        return self.project(F.gelu(self.project(x, self.up)), self.down)

    def project(self, x: Tensor, layer: nn.Linear) -> Tensor:
        """``layer(x)``, its GEMMs in float8 when this block's are."""
        if self.gemms is None:
            return layer(x)
        return fp8_linear(x, layer.weight, layer.bias, self.gemms.scaling)
