"""Parameters, groups and gradients for the optimizer tests (tests/ten/train:
test_adamw8bit, test_optimizer_state): the same seeded tensors every time."""

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
