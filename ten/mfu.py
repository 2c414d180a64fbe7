"""Model FLOPs utilisation: achieved training FLOP/s over the device's dense bf16 peak."""

from __future__ import annotations

import torch

# Dense bf16 tensor-core peaks in TFLOP/s (no sparsity), matched against the CUDA
# device name. Order matters: the first substring found wins.
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 125.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
}


def peak_flops(device: torch.device | str) -> float | None:
    """Peak bf16 FLOP/s of a CUDA device, or None (CPU, or a GPU not in the table)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None


def mfu(flops_per_token: float, tokens_per_second: float, peak: float | None) -> float | None:
    """Fraction of peak achieved; None where the peak is unknown (CPU shows none)."""
    if not peak:
        return None
    return flops_per_token * tokens_per_second / peak
