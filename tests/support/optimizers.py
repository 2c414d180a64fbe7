"""Parameters, groups and gradients for the optimizer tests (tests/ten/train:
test_adamw8bit, test_adamw8bit_launches, test_optimizer_state): the same seeded tensors
every time; and bitsandbytes' moments decoded."""

from __future__ import annotations

import torch

SEED = 0


def make_params(device: str = "cpu") -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(SEED)
    # a matrix past bitsandbytes' 4096-element threshold for 8-bit states, and a vector
    return [torch.nn.Parameter(torch.randn(96, 64, generator=g).to(device)),
            torch.nn.Parameter(torch.randn(64, generator=g).to(device))]


def make_groups(params: list[torch.nn.Parameter]) -> list[dict]:
    return [{"params": params[:1], "weight_decay": 0.1},
            {"params": params[1:], "weight_decay": 0.0}]


def take_steps(opt, params, steps: int, first: int = 0) -> None:
    """``steps`` optimizer steps on seeded gradients (step i's from seed 1000 + i)."""
    for i in range(first, first + steps):
        g = torch.Generator().manual_seed(1000 + i)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.device)
        opt.step()


def decoded(opt, p, k: int) -> torch.Tensor:
    """bitsandbytes' moment k (1: the mean, 2: the mean square) of p, float32 (its own
    decoding; bitsandbytes imported here, when a test runs)."""
    import bitsandbytes.functional as F

    s = opt.state[p]
    if s[f"state{k}"].dtype != torch.uint8:
        return s[f"state{k}"]
    return F.dequantize_blockwise(s[f"state{k}"], absmax=s[f"absmax{k}"], code=s[f"qmap{k}"],
                                  blocksize=256)
