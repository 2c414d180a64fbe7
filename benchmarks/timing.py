"""The benchmarks' clock for one call on a device: the median of repeated runs after
warm-ups, each synchronised with the GPU before and after on CUDA (a kernel launch
returns before its work is done)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(once: Callable[[], object], device: torch.device, repeat: int,
              warmup: int = 3) -> float:
    """``once()``'s median time in milliseconds over ``repeat`` runs, after ``warmup``."""
    for _ in range(warmup):
        once()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        once()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)
