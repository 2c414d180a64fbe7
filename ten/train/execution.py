"""How a run computes on its device, decided once before any work: the autocast dtype,
TF32 for fp32 matmuls on a GPU, and the scan and loss backends, each from the job's
setting (``auto`` picks for the device; an explicit choice that cannot run here raises
with the fix), with the lines the run logs about them. The trainer, its memory check and
the GPU suite (benchmarks/gpu_suite.py) all take this one decision, so what the suite
measures is what the trainer runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ten.kernels.fp8 import check_device
from ten.kernels.loss import check_fp8_head, resolve_loss_backend
from ten.kernels.scan import resolve_scan

__all__ = ["Execution", "planned_for_cuda", "resolve_execution", "resolve_precision"]


# TrainConfig.precision's explicit values -> the autocast dtype (None: plain fp32)
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None: plain fp32). auto = bf16 on GPUs that have it, fp16 on
    older GPUs, fp32 on CPU (bf16 autocast on CPU is slower than fp32)."""
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return AMP_DTYPES[precision]


@dataclass(frozen=True)
class Execution:
    """The resolved choices: ``amp_dtype`` (None: fp32), ``tf32`` (fp32 matmuls and
    convolutions as TF32: on CUDA), ``scan`` (None for a model without one: the
    transformer), ``loss``, and ``notes``, one log line for each backend."""

    amp_dtype: torch.dtype | None
    tf32: bool
    scan: str | None
    loss: str
    notes: tuple[str, ...]

    def model_config(self, config: Any) -> Any:
        """``config`` as the model is built to run here: a TEN's scan backend is this
        decision's (the saved config keeps the job's, ``auto`` included)."""
        if self.scan is None or getattr(config, "scan_backend", None) is None:
            return config
        return dataclasses.replace(config, scan_backend=self.scan)

    def set_torch_flags(self) -> None:
        """torch's process-wide switches this needs; before the first matmul. (Under bf16
        autocast few matmuls stay fp32: the eigenstate coupling folded into W_out.)"""
        if self.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True


def resolve_execution(model_config: Any, precision: str, loss: str,
                      device: torch.device) -> Execution:
    """The job's ``TrainConfig.precision`` and ``loss`` and its model's ``scan_backend``
    as they run on ``device``. Raises ScanBackendError or ValueError, naming the setting,
    when an explicit backend cannot run here, and FP8Error for a model's float8 GEMMs on
    a device without FP8 tensor cores."""
    notes = []
    fp8, head = getattr(model_config, "fp8", "off"), getattr(model_config, "fp8_head", False)
    if fp8 != "off":
        check_device(device, f"{type(model_config).__name__}.fp8")
        if head:
            check_fp8_head(loss)
        notes.append(f"fp8: the feed-forward block's GEMMs in float8 (one scale a {fp8})"
                     + (", and the head's (one scale a tensor)" if head else ""))
    scan = getattr(model_config, "scan_backend", None)  # TEN's only
    if scan is not None:
        scan, note = resolve_scan(scan, device)
        notes.append(note)
    loss, note = resolve_loss_backend(loss, device)
    notes.append(note)
    return Execution(resolve_precision(precision, device), device.type == "cuda", scan, loss,
                     tuple(notes))


def planned_for_cuda(model_config: Any, precision: str, loss: str) -> Execution:
    """What :func:`resolve_execution` decides on a CUDA card (every card of ten.cards has
    bf16), decided on a machine without one, e.g. to check a job's memory against a card
    before renting it: ``auto`` picks the fused scan and loss, bf16 autocast."""
    scan = getattr(model_config, "scan_backend", None)
    if scan == "auto":
        scan = "fused"
    amp = torch.bfloat16 if precision == "auto" else AMP_DTYPES[precision]
    return Execution(amp, True, scan, "fused" if loss == "auto" else loss,
                     ("planned for a CUDA card",))
