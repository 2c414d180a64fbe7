"""Will a training job fit the device? An estimate made before training, without memory.

The model is built and run — forward and backward at the job's real batch and sequence
length — under ``FakeTensorMode``: every tensor has its shape, dtype and storage but no
data, so a 32K-token step of a 1 GB model is traced in seconds on any CPU. torch's
``MemTracker`` follows every storage through that step and reports the peak of what was
live at once (weights, saved activations, gradients, temporaries); the optimizer's state,
which exists from the first update on, is added by count (AdamW: 8 bytes per parameter,
8-bit AdamW: 2).

The step runs under CPU autocast in the job's dtype: CUDA does not exist in fake mode
without a GPU, and the two autocast lists agree on what matters here (matmuls in bf16,
the scan and the loss in fp32). The scan and the loss are traced with the backends the
job runs on its device (the fused ones on a GPU: their operators trace by their fakes on
any machine; Liger's loss, which has none, as the fused one, which holds a little more).
On an H100 the flagship job's estimate was within 1–2% of what its steps allocated at
batch 1, 2, 4 and 8 (9.57 / 17.70 / 33.96 / 66.47 GB against 9.66 / 17.32 / 33.58 /
66.10, commit 600a887); the chunked scan and loss, traced for every job until then, over
by 39–46%. Not counted: the CUDA context and cuBLAS workspaces (the fit check leaves
``RESERVE_BYTES`` for them), and what the caching allocator holds beyond what is allocated
(the fit check adds ``MARGIN``).

TEN only: the transformer baseline's attention would be traced with the math kernel,
whose T×T scores FlashAttention never holds.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

GiB = 2**30
RESERVE_BYTES = 1 * GiB  # CUDA context, cuBLAS/cuDNN workspaces: outside the allocator
# The estimate's share added for the caching allocator's slack and the estimate's own
# misses (-0.9% to +2.2% measured on an H100): a job is refused above estimate x 1.05.
MARGIN = 0.05
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adamw8bit": 2}  # per parameter: two moments


class DeviceMemoryError(ValueError):
    """The job's estimated training memory exceeds the device's (one line: the estimate,
    the device, and the settings that lower it)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes at the training step's peak, by kind."""

    weights: int
    gradients: int
    activations: int  # saved for backward, and temporaries, at the peak
    optimizer: int
    batch_size: int
    seq_len: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.activations + self.optimizer

    def describe(self) -> str:
        return (f"{_size(self.total)} (activations {_size(self.activations)} at batch_size "
                f"{self.batch_size} x seq_len {self.seq_len}, weights {_size(self.weights)}, "
                f"gradients {_size(self.gradients)}, optimizer {_size(self.optimizer)})")


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 2**20:.0f} MiB"


def estimate_training_memory(model_config: Any, batch_size: int, seq_len: int,
                             amp_dtype: torch.dtype | None = None,
                             optimizer: str = "adamw", *, scan_backend: str = "chunked",
                             loss_backend: str = "chunked") -> MemoryEstimate:
    """The peak memory of one training micro-batch of a TEN model (see the module doc),
    with the scan and loss backends that run (``ten.train.execution.resolve_execution`` for the
    job's device)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from ten.kernels.loss import NextTokenLoss
    from ten.model.ten import TENLM, TENConfig

    if not isinstance(model_config, TENConfig):
        raise TypeError(f"memory is estimated for TEN models only, not "
                        f"{type(model_config).__name__}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATE_BYTES)}, "
                         f"got {optimizer!r}")
    config = dataclasses.replace(model_config, scan_backend=scan_backend)
    with FakeTensorMode(), torch.device("cpu"):
        model = TENLM(config)
        objective = NextTokenLoss(model, "fused" if loss_backend == "liger" else loss_backend)
        ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
        tracker = MemTracker()
        tracker.track_external(objective)
        with tracker:
            with torch.autocast("cpu", dtype=amp_dtype or torch.float32,
                                enabled=amp_dtype is not None):
                loss = objective(ids, ids)
            loss.backward()
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    n_params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    by_kind = {str(kind.value) if hasattr(kind, "value") else str(kind): n
               for kind, n in peak.items()}
    weights = by_kind.get("Parameter", param_bytes) + by_kind.get("Buffer", 0)
    # Gradients accumulate over micro-batches and exist whole at the optimizer step;
    # count them whole rather than as much as happened to be live at the peak.
    activations = by_kind["Total"] - weights - by_kind.get("Gradient", 0)
    return MemoryEstimate(weights=weights, gradients=param_bytes,
                          activations=max(activations, 0),
                          optimizer=n_params * OPTIMIZER_STATE_BYTES[optimizer],
                          batch_size=batch_size, seq_len=seq_len)


def fit_problem(estimate: MemoryEstimate, device_bytes: int, device_name: str,
                model_config: Any, reserve: int = RESERVE_BYTES) -> str | None:
    """None when the estimate (plus ``MARGIN`` of it and ``reserve``: the CUDA context's
    on a GPU) fits ``device_bytes``; else one line with the estimate, the device and the
    settings that lower it."""
    if estimate.total * (1 + MARGIN) + reserve <= device_bytes:
        return None
    context = (f" (plus {MARGIN:.0%} for the allocator"
               + (f" and {_size(reserve)} for the CUDA context)" if reserve else ")"))
    return (f"the job does not fit the {_size(device_bytes)} {device_name}: training needs "
            f"an estimated {estimate.describe()}{context}; "
            + lowering(model_config, estimate.batch_size, estimate.seq_len))


def lowering(model_config: Any, batch_size: int, seq_len: int) -> str:
    """The settings that lower a job's training memory, most effective first."""
    from ten.model.lm import recomputed_blocks

    knobs = []
    if recomputed_blocks(model_config) < model_config.n_layers:
        config = type(model_config).__name__
        knobs.append(f"set {config}.grad_checkpointing to true"
                     if not model_config.grad_checkpointing
                     else f"raise {config}.checkpoint_blocks (null: every block)")
    if batch_size > 1:
        knobs.append("lower TrainConfig.batch_size (raise TrainConfig.grad_accum to keep the "
                     "tokens per step)")
    knobs.append(f"lower DataConfig.seq_len (now {seq_len})")
    return ", or ".join(knobs)


def exhausted(e: BaseException) -> str | None:
    """For an out-of-memory error (Python's, torch's on the CPU or a GPU): one line saying
    what was asked of what ("8.0 GiB on the CPU"; as much as it says); None for any other
    error."""
    text = str(e)
    if isinstance(e, MemoryError):
        return "Python could not allocate memory"
    if not (isinstance(e, torch.OutOfMemoryError) or isinstance(e, RuntimeError)
            and "can't allocate memory" in text):
        return None
    asked = re.search(r"allocate (\d+) bytes", text)  # the CPU allocator's words
    if asked:
        return f"{_size(int(asked.group(1)))} could not be allocated on the CPU"
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]iB)", text)  # CUDA's
    return f"{asked.group(1) if asked else 'memory'} could not be allocated on the GPU"


def device_capacity(device: torch.device) -> tuple[str, int] | None:
    """(name, total bytes) of a CUDA device; None elsewhere."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return props.name, props.total_memory


def host_available() -> int | None:
    """Bytes this process can still allocate on a Linux host: the kernel's MemAvailable,
    or less when a container's cgroup (v2 ``memory.max``) leaves less; None elsewhere."""
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        available = next(int(ln.split()[1]) * 1024 for ln in meminfo
                         if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text())
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(available, 0)


def rough_training_bytes(model_config: Any, batch_size: int, seq_len: int) -> int:
    """A quick, generous guess at a job's training memory, without tracing it: 16 bytes a
    parameter (weights, gradients, AdamW's moments; 12·d² a layer and the embedding) and
    64 bytes per activation element of the residual stream in every layer. It only
    decides whether the CPU check is worth the seconds the estimate takes. (Not
    ``ten.model.presets.count_params``: building even a meta-device model costs ~2 s the first
    time in a process, what this guess exists to spare small runs.)"""
    d, layers = model_config.d_model, model_config.n_layers
    params = model_config.vocab_size * d + layers * 12 * d * d
    return 16 * params + 64 * batch_size * seq_len * d * layers


def check_fits(model_config: Any, batch_size: int, seq_len: int,
               amp_dtype: torch.dtype | None, optimizer: str, device: torch.device,
               scan_backend: str = "chunked", loss_backend: str = "chunked") -> str | None:
    """Before training: raise :class:`DeviceMemoryError` when a TEN job's estimate exceeds
    the GPU, or on a CPU the memory the machine has available; else the line to log, or
    None where nothing was checked (no capacity known; the transformer on a CPU; a CPU job
    whose rough size is under a quarter of what is available: the estimate takes seconds)."""
    from ten.model.ten import TENConfig

    if device.type == "cpu":
        available = host_available()
        if not isinstance(model_config, TENConfig) or available is None or \
                rough_training_bytes(model_config, batch_size, seq_len) < available / 4:
            return None
        capacity, reserve = ("of memory available on this machine", available), 0
    else:
        capacity, reserve = device_capacity(device), RESERVE_BYTES
        if capacity is None:
            return None
    return fits(model_config, batch_size, seq_len, amp_dtype, optimizer, capacity, reserve,
                scan_backend, loss_backend)


def check_fits_card(model_config: Any, batch_size: int, seq_len: int,
                    amp_dtype: torch.dtype | None, optimizer: str, card: str,
                    scan_backend: str, loss_backend: str) -> str:
    """:func:`check_fits` for a card named in ten.cards, before one is rented (with the
    backends as they would run on it: ten.train.execution.planned_for_cuda)."""
    from ten.cards import CARDS

    spec = CARDS[card]
    return fits(model_config, batch_size, seq_len, amp_dtype, optimizer,
                (spec.cuda_name, spec.memory_bytes), RESERVE_BYTES, scan_backend,
                loss_backend)


def fits(model_config: Any, batch_size: int, seq_len: int, amp_dtype: torch.dtype | None,
         optimizer: str, capacity: tuple[str, int], reserve: int, scan_backend: str,
         loss_backend: str) -> str:
    """The line to log when a job's estimate fits ``capacity`` (name, bytes) less
    ``reserve``; DeviceMemoryError when it does not."""
    from ten.model.ten import TENConfig

    if not isinstance(model_config, TENConfig):
        return "memory: not estimated for the transformer baseline"
    name, total = capacity
    estimate = estimate_training_memory(model_config, batch_size, seq_len, amp_dtype, optimizer,
                                        scan_backend=scan_backend, loss_backend=loss_backend)
    problem = fit_problem(estimate, total, name, model_config, reserve)
    if problem:
        raise DeviceMemoryError(problem)
    return f"memory: an estimated {estimate.describe()} of the {_size(total)} {name}"
