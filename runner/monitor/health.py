"""Pre-flight health gate: before training on a GPU, check the device is visible, report
driver and CUDA versions, time a short bf16 matmul against the expected peak for the
detected GPU (ten.mfu.PEAK_BF16_TFLOPS) and check free memory. A failing host should
exit with a distinct code so the supervisor does not retry on the same host.

:func:`judge` is the pure policy (tested from tables); :func:`preflight` gathers the
facts (torch imported only here) and calls it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

MIN_PEAK_FRACTION = 0.35  # a healthy dense bf16 matmul reaches 60-80% of the spec peak
MIN_FREE_FRACTION = 0.80  # less free memory: another process holds the GPU


@dataclass
class HealthReport:
    ok: bool
    lines: list[str] = field(default_factory=list)  # what was checked, for the run log
    reason: str | None = None  # one line when not ok
    facts: dict[str, Any] = field(default_factory=dict)


def judge(facts: dict[str, Any], min_peak_fraction: float = MIN_PEAK_FRACTION,
          min_free_fraction: float = MIN_FREE_FRACTION) -> HealthReport:
    """Decide from gathered facts: name, driver, cuda, total_bytes, free_bytes, tflops
    (measured), peak_tflops (None for a GPU not in the table), error (a failed check)."""
    name = facts.get("name") or "GPU"
    lines = [f"GPU {name}, driver {facts.get('driver') or '?'}, "
             f"CUDA {facts.get('cuda') or '?'}"]
    problems = []
    if facts.get("error"):
        problems.append(f"{name}: {facts['error']}")
    total, free = facts.get("total_bytes"), facts.get("free_bytes")
    if total and free is not None:
        lines.append(f"memory {free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
        if free < min_free_fraction * total:
            problems.append(f"{name}: only {free / 2**30:.1f} of {total / 2**30:.1f} GiB "
                            "free — another process is using this GPU")
    tflops, peak = facts.get("tflops"), facts.get("peak_tflops")
    if tflops is not None:
        if peak:
            lines.append(f"bf16 matmul {tflops:.0f} TFLOP/s ({100 * tflops / peak:.0f}% of "
                         f"the {peak:.0f} peak)")
            if tflops < min_peak_fraction * peak:
                problems.append(f"{name}: bf16 matmul {tflops:.0f} TFLOP/s is under "
                                f"{100 * min_peak_fraction:.0f}% of its {peak:.0f} TFLOP/s "
                                "peak — a degraded or throttled host")
        else:
            lines.append(f"bf16 matmul {tflops:.0f} TFLOP/s (no expected peak for {name})")
    if problems:
        return HealthReport(False, lines, "health gate failed: " + "; ".join(problems) +
                            " — move to another host", facts)
    lines.append("health gate passed")
    return HealthReport(True, lines, None, facts)


def expected_peak_tflops(name: str) -> float | None:
    """The exact device's dense bf16 peak (ten.mfu's table): a MIG slice or an unlisted
    part has none, so the gate reports the TFLOP/s without judging them."""
    from ten.mfu import peak_tflops_for

    return peak_tflops_for(name)


def preflight(device: str = "auto", matmul_n: int = 8192, seconds: float = 1.0,
              **thresholds: float) -> HealthReport:
    """The gate for ``device`` ("auto", "cuda", "cuda:1", "cpu"). On CPU (or auto with no
    GPU) it passes with "no GPU: health gate skipped"."""
    import torch

    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return HealthReport(True, ["no GPU: health gate skipped"])
    if not torch.cuda.is_available():
        return HealthReport(False, [], f"health gate failed: {device} requested but no CUDA "
                            "device is visible (driver or container runtime missing) — "
                            "move to another host")
    dev = torch.device("cuda" if device == "auto" else device)
    facts: dict[str, Any] = {"cuda": torch.version.cuda}
    try:
        facts["name"] = torch.cuda.get_device_name(dev)
        facts["driver"] = _driver_version()
        facts["free_bytes"], facts["total_bytes"] = torch.cuda.mem_get_info(dev)
        facts["peak_tflops"] = expected_peak_tflops(facts["name"])
        facts["tflops"] = matmul_tflops(dev, matmul_n, seconds)
    except Exception as e:  # noqa: BLE001 - a CUDA error here is the verdict
        facts["error"] = " ".join(str(e).split())[:200] or type(e).__name__
    return judge(facts, **thresholds)


def matmul_tflops(dev: Any, n: int, seconds: float) -> float:
    """Best bf16 (n x n) @ (n x n) rate over about ``seconds`` of repeats."""
    import torch

    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):  # warm-up: cuBLAS heuristics, clocks
        a @ b
    torch.cuda.synchronize(dev)
    best, deadline, reps = 0.0, time.perf_counter() + seconds, 10
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        torch.cuda.synchronize(dev)  # host sync: this is a timing
        elapsed = time.perf_counter() - t0
        best = max(best, 2 * n**3 * reps / elapsed / 1e12)
        if time.perf_counter() > deadline:
            break
    del a, b
    torch.cuda.empty_cache()
    return best


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - the driver version is informative only
        return None
