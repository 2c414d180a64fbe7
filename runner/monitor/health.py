"""Pre-flight health gate: before training on a GPU, check the device is visible, report
driver and CUDA versions, time a short bf16 matmul against the expected peak for the
detected GPU (ten.train.mfu.PEAK_BF16_TFLOPS) and check free memory. A failing host exits
with UNHEALTHY_HOST, so the supervisor moves to another host.

A GPU that NVML sees but torch cannot use is not bad hardware: the host's driver is
older than the CUDA the image's torch was built for (CUDA 13 needs driver 580), or torch
is a CPU-only build. Every host of that machine image fails the same way, so the gate
exits with GPU_UNUSABLE (not retried) and names the fix; with ``device: auto`` it
refuses to train on the CPU instead of quietly paying GPU prices for a CPU run.

:func:`judge` and :func:`judge_unusable` are the pure policy (tested from tables);
:func:`preflight` gathers the facts (torch and pynvml imported only here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runner.exit_codes import ExitCode

MIN_PEAK_FRACTION = 0.35  # a healthy dense bf16 matmul reaches 60-80% of the spec peak
MIN_FREE_FRACTION = 0.80  # less free memory: another process holds the GPU
# The oldest Linux driver that runs each CUDA major version (CUDA's minor-version
# compatibility: the driver of a major's first release runs all of its minors).
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
OLDER_DRIVERS = "README: Older drivers"  # where the CUDA 12 image build is documented


@dataclass
class HealthReport:
    ok: bool
    lines: list[str] = field(default_factory=list)  # what was checked, for the run log
    reason: str | None = None  # one line when not ok
    facts: dict[str, Any] = field(default_factory=dict)
    exit_code: ExitCode = ExitCode.UNHEALTHY_HOST  # when not ok


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


def judge_unusable(facts: dict[str, Any]) -> HealthReport:
    """The verdict when NVML sees ``nvml_gpus`` > 0 GPUs but torch has no CUDA device.
    Facts: nvml_gpus, name, driver ("535.104.05"), driver_cuda (the newest CUDA the
    driver runs, "12.2"), torch_cuda (the CUDA torch was built for, None: a CPU build),
    torch_version, error (torch's own complaint). Always GPU_UNUSABLE, with the fix."""
    n, name = facts["nvml_gpus"], facts.get("name") or "GPU"
    driver, driver_cuda = facts.get("driver") or "?", facts.get("driver_cuda")
    torch_cuda = facts.get("torch_cuda")
    seen = f"NVML sees {n} GPU(s) ({name}, driver {driver}) but torch cannot use them"
    lines = [f"{name}, driver {driver} (CUDA {driver_cuda or '?'}); torch "
             f"{facts.get('torch_version') or '?'} built for CUDA {torch_cuda or 'none (CPU)'}"]
    if torch_cuda is None:
        why = (f"{seen}: this torch is a CPU-only build — install the CUDA build (the "
               "image's), or set train.device: cpu to train on the CPU on purpose")
    elif driver_cuda and _major(driver_cuda) < _major(torch_cuda):
        needed = MIN_DRIVER.get(_major(torch_cuda), "newer")
        older = (f", or build the image for CUDA 12 ({OLDER_DRIVERS})"
                 if _major(torch_cuda) > 12 >= _major(driver_cuda) > 11 else "")
        why = (f"{seen}: driver {driver} runs CUDA up to {driver_cuda}, this image's torch "
               f"needs CUDA {torch_cuda} (driver >= {needed}) — use a host or machine "
               f"image with driver >= {needed}{older}")
    else:
        error = f" ({facts['error']})" if facts.get("error") else ""
        why = (f"{seen}{error}: check CUDA_VISIBLE_DEVICES and that the container has "
               "the GPUs (docker run --gpus all), or set train.device: cpu to train on "
               "the CPU on purpose")
    return HealthReport(False, lines, "GPU unusable: " + why, facts, ExitCode.GPU_UNUSABLE)


def _major(version: str) -> int:
    return int(str(version).split(".")[0])


def expected_peak_tflops(name: str) -> float | None:
    """The exact device's dense bf16 peak (ten.train.mfu's table): a MIG slice or an unlisted
    part has none, so the gate reports the TFLOP/s without judging them."""
    from ten.train.mfu import peak_tflops_for

    return peak_tflops_for(name)


def gpu_expected(device: str) -> bool:
    """Whether a job on ``device`` is a GPU job: one to gate and monitor. False for
    ``cpu``, and for ``auto`` on a machine with no GPU at all; a GPU that the driver shows
    and CUDA cannot use is one (the gate then fails it), as is an explicit ``cuda``."""
    if device == "cpu":
        return False
    if device != "auto":
        return True
    import torch

    return torch.cuda.is_available() or bool(nvml_facts().get("nvml_gpus"))


def preflight(device: str = "auto", matmul_n: int = 8192, seconds: float = 1.0,
              **thresholds: float) -> HealthReport:
    """The gate for ``device`` ("auto", "cuda", "cuda:1", "cpu"). On CPU, or auto on a
    machine with no GPU at all, it passes with "no GPU: health gate skipped"; a GPU that
    NVML sees and torch cannot use fails it (:func:`judge_unusable`), also for auto."""
    import torch

    if not gpu_expected(device):
        return HealthReport(True, ["no GPU: health gate skipped"])
    if not torch.cuda.is_available():
        present = nvml_facts()
        if present.get("nvml_gpus"):
            return judge_unusable({**present, **torch_facts()})
        return HealthReport(False, [], f"health gate failed: {device} requested but no CUDA "
                            "device is visible (driver or container runtime missing) — "
                            "move to another host")
    dev = torch.device("cuda" if device == "auto" else device)
    facts: dict[str, Any] = {"cuda": torch.version.cuda}
    try:
        facts["name"] = torch.cuda.get_device_name(dev)
        facts["driver"] = nvml_facts().get("driver")
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


def torch_facts() -> dict[str, Any]:
    """What torch was built for, and its complaint when CUDA will not initialise."""
    import torch

    facts: dict[str, Any] = {"torch_version": torch.__version__,
                             "torch_cuda": torch.version.cuda}
    if torch.version.cuda is not None:
        try:
            torch.cuda.init()
        except Exception as e:  # noqa: BLE001 - the complaint is the fact
            facts["error"] = " ".join(str(e).split())[:200] or type(e).__name__
    return facts


def nvml_facts() -> dict[str, Any]:
    """The GPUs the driver itself reports (NVML ignores CUDA_VISIBLE_DEVICES and works
    with any CUDA): nvml_gpus, name, driver, driver_cuda. Empty without NVML."""
    from runner.monitor.nvml import _text  # NVML's strings: bytes in older bindings

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver library: no GPU to speak of
        return {}
    facts: dict[str, Any] = {}
    try:
        facts["nvml_gpus"] = int(pynvml.nvmlDeviceGetCount())
        facts["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())  # 12020 for CUDA 12.2
        facts["driver_cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        if facts["nvml_gpus"]:
            facts["name"] = _text(pynvml.nvmlDeviceGetName(
                pynvml.nvmlDeviceGetHandleByIndex(0)))
    except Exception:  # noqa: BLE001 - keep what was read
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return facts

