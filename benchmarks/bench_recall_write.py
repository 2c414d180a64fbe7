"""bench_recall with another selective write: one linear in the step when the step is small.

The model's selective write is γ_t = sqrt(1 - |λ_t|²): variance-preserving, but a token
the layer means to skip (a small step Δ) is still written with γ ≈ sqrt(2·rate·Δ), so
over N skipped tokens the noise on a held state grows as sqrt(N·Δ). Mamba's
zero-order hold writes ~Δ instead. This variant keeps the fixed model's write at Δ = 1
and Mamba's shape elsewhere:

    γ_t = γ̄ · (1 - |λ_t|²) / (1 - |λ̄|²),    γ̄ = sqrt(1 - |λ̄|²), λ̄ the step-1 eigenvalue

so a small step writes ∝ Δ and an overwrite (Δ -> ∞) writes 1/γ̄. Measured against the
model's own write in BENCHMARKS.md ("Recall diagnostics"); not adopted.

    python benchmarks/bench_recall_write.py --tasks copy_first --T 64 \\
        --lengths 64 256 1024 4096 --steps 3000 --models ten_selective_conv

Every bench_recall.py argument works; only the selective models change.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import ten.model.ten as tm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_recall  # noqa: E402

_model_eigenvalues = tm.EigenstateMixer.eigenvalues
_model_drive = tm.EigenstateMixer.drive


def linear_write_eigenvalues(self: tm.EigenstateMixer, xn: torch.Tensor | None = None):
    if self.delta is None:
        return _model_eigenvalues(self, xn)
    rate, step = torch.exp(self.nu), self.step(xn)
    at_one = -torch.expm1(-2.0 * rate)  # 1 - |λ̄|²
    gamma = -torch.expm1(-2.0 * rate * step) / torch.sqrt(at_one)
    return (torch.cat([-rate * step, self.theta * step], dim=-1),
            torch.cat([gamma, gamma], dim=-1))


def linear_write_drive(self: tm.EigenstateMixer, u: torch.Tensor):
    """The mixer's (log λ, β) with this write (the model's runs as one operator)."""
    log_lam, gamma = self.eigenvalues(u) if self.delta is not None else self.eigenvalues()
    return log_lam, self.in_proj(u) * gamma


def main(argv: list[str] | None = None) -> None:
    tm.EigenstateMixer.eigenvalues = linear_write_eigenvalues
    tm.EigenstateMixer.drive = linear_write_drive
    try:
        bench_recall.main(argv)
    finally:
        tm.EigenstateMixer.eigenvalues = _model_eigenvalues
        tm.EigenstateMixer.drive = _model_drive


if __name__ == "__main__":
    main()
