"""Model and hardware FLOPs utilisation against the device's dense bf16 peak.

MFU counts the FLOPs the model needs (``flops_per_token``: 6 per weight and token, plus
the sequence mixing); HFU counts what the hardware actually ran, recomputation included
(activation checkpointing runs every block's forward twice). Both divide by the dense
bf16 tensor-core peak with fp32 accumulation (what PyTorch's bf16 matmuls use) of the
exact device: a GPU name not in the table gets no peak, and MFU/HFU are omitted rather
than guessed.
"""

from __future__ import annotations

import torch

# Dense (no 2:4 sparsity) bf16 tensor-core TFLOP/s with fp32 accumulate, keyed by the
# exact torch.cuda.get_device_name() string. Vendor datasheets quote sparse figures
# first; the dense one is half.
PEAK_BF16_TFLOPS: dict[str, float] = {
    # Hopper. H100 SXM5 datasheet: BF16 1,979 sparse; PCIe 1,513; NVL 1,671.
    "NVIDIA H100 80GB HBM3": 989.0,  # the SXM5 part reports its memory, not "SXM"
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA H200 NVL": 835.0,  # H200 NVL datasheet: 1,671 sparse
    "NVIDIA H200": 989.0,  # H200 SXM datasheet: 1,979 sparse
    "NVIDIA GH200 480GB": 989.0,  # GH200 datasheet: 1,979 sparse (the Hopper half)
    # Blackwell. HGX B200: 36 PFLOPS FP16/BF16 sparse for 8 GPUs -> 2,250 dense each.
    "NVIDIA B200": 2250.0,
    # Ampere datacenter. A100 datasheet: 312 dense for 40/80 GB, SXM4 and PCIe alike.
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A100-PCIE-80GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    # AWS's A10 variant: no NVIDIA datasheet; AWS/Baseten spec tables give 70 TFLOPS
    # fp16/bf16 tensor (the A10 prioritises tensor throughput, the A10G shader throughput).
    "NVIDIA A10G": 70.0,
    "NVIDIA A10": 125.0,  # A10 datasheet: BF16 125 | 250 sparse
    # Ada datacenter (full-rate fp32 accumulate).
    "NVIDIA L40S": 362.0,  # L40S datasheet: BF16 362.05 | 733 sparse
    "NVIDIA L40": 181.0,  # L40 datasheet: BF16 181.05 | 362.1 sparse
    "NVIDIA L4": 121.0,  # L4 datasheet: BF16 242 sparse
    # GeForce: fp32 accumulate runs at half the fp16-accumulate rate. Ada whitepaper,
    # RTX 4090: FP16/BF16 with FP32 accumulate 165.2 dense (330.3 is FP16 accumulate).
    "NVIDIA GeForce RTX 4090": 165.2,
    # GA102 whitepaper, RTX 3090: FP16/BF16 tensor with FP32 accumulate 71 dense.
    "NVIDIA GeForce RTX 3090": 71.0,
}


def peak_tflops_for(name: str) -> float | None:
    """The table's peak for an exact device name (whitespace-trimmed), else None: a MIG
    slice ("NVIDIA H100 80GB HBM3 MIG 1g.10gb") or an unlisted part has no known peak."""
    return PEAK_BF16_TFLOPS.get(name.strip())


def device_name(device: torch.device | str) -> str | None:
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def peak_flops(device: torch.device | str) -> float | None:
    """Peak bf16 FLOP/s of a CUDA device, or None (CPU, or a GPU not in the table)."""
    name = device_name(device)
    tflops = None if name is None else peak_tflops_for(name)
    return None if tflops is None else tflops * 1e12


def peak_note(device: torch.device | str) -> str | None:
    """The one line to log when a GPU's peak is unknown (None on CPU or a known GPU)."""
    name = device_name(device)
    if name is None or peak_tflops_for(name) is not None:
        return None
    return f"MFU omitted: unknown peak for {name}"


def mfu(flops_per_token: float, tokens_per_second: float, peak: float | None) -> float | None:
    """Fraction of peak achieved; None where the peak is unknown (CPU shows none)."""
    if not peak:
        return None
    return flops_per_token * tokens_per_second / peak


def hfu(flops_per_token: float, recompute_flops_per_token: float, tokens_per_second: float,
        peak: float | None) -> float | None:
    """Hardware FLOPs utilisation: MFU's FLOPs plus those run again in backward
    (``LanguageModel.recompute_flops_per_token``); equal to MFU without checkpointing."""
    return mfu(flops_per_token + recompute_flops_per_token, tokens_per_second, peak)
