"""The GPU models a job can name (``resources.accelerator``): for each, the name CUDA
reports for it and its memory as ``nvidia-smi`` reports it. The names are those clouds
and SkyPilot use for the card, so a job's accelerator travels to a SkyPilot task as it
is. Torch-free: the job schema reads the names.

The memory lets a job be checked against a card before one is rented
(:func:`ten.train.memory.check_fits_card`); the CUDA name is the key of the peak-FLOPs table
(ten.train.mfu), which counts what a card delivers once it runs; the memory bandwidth
(the datasheet's) is what the benchmarks hold memory-bound kernels to.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class Card:
    cuda_name: str  # torch.cuda.get_device_name on it
    memory_mib: int  # nvidia-smi's "memory.total"
    bandwidth: float  # memory bandwidth, bytes/s: the datasheet's

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB


CARDS: dict[str, Card] = {
    "L40S": Card("NVIDIA L40S", 46068, 0.864e12),  # the card the job presets are sized for
    "L4": Card("NVIDIA L4", 23034, 0.300e12),
    "A10G": Card("NVIDIA A10G", 23028, 0.600e12),
    "A100": Card("NVIDIA A100-SXM4-40GB", 40960, 1.555e12),
    "A100-80GB": Card("NVIDIA A100-SXM4-80GB", 81920, 2.039e12),
    "H100": Card("NVIDIA H100 80GB HBM3", 81559, 3.35e12),
    "H200": Card("NVIDIA H200", 143771, 4.8e12),
}
ACCELERATORS = tuple(CARDS)
DEFAULT_ACCELERATOR = "L40S"


def card_named(cuda_name: str) -> Card | None:
    """The card CUDA calls ``cuda_name`` (whitespace-trimmed), or None: an unlisted part, or
    a MIG slice ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"), whose share of the card is unknown."""
    return next((c for c in CARDS.values() if c.cuda_name == cuda_name.strip()), None)
