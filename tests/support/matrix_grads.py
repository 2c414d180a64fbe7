"""The matrix scan's outputs and every gradient under one seeded loss, and the error the
kernel tests hold them to (tests/ten/kernels/test_matrix_scan_fused.py,
tests/test_bench_scan.py): a backend against the reference the same way everywhere."""

from __future__ import annotations

import torch

from ten.kernels.matrix_scan import matrix_scan


def outputs_and_grads(tensors: list[torch.Tensor], state: torch.Tensor | None, heads: int,
                      backend: str, seed: int) -> list[torch.Tensor]:
    """[y, the last state, d of each of ``tensors`` (k, v, q, log λ; leaves), d state]
    of a loss that reads y and the last state with weights seeded ``seed``."""
    y, last = matrix_scan(*tensors, state, heads=heads, backend=backend, chunk_size=8)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y)
    w_last = torch.randn(last.shape, generator=g, dtype=torch.complex128).to(last)
    loss = (y * w).sum() + (last.conj() * w_last).real.sum()  # the last state read too
    inputs = tensors + ([state] if state is not None else [])
    return [y, last, *torch.autograd.grad(loss, inputs)]


def relative_error(want: torch.Tensor, got: torch.Tensor) -> float:
    """Largest |want - got| over the largest |want| (at least 1)."""
    return ((want - got).abs().max() / want.abs().max().clamp(min=1.0)).item()
