"""Process-group set-up for data-parallel training under ``torchrun``.

The model knows nothing of parallelism: the trainer wraps it in DDP when torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK) says there is more than one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_from_env(device_type: str) -> DistInfo:
    """Join the process group torchrun describes (gloo on CPU, NCCL on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend)
    return info


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def broadcast_flag(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every rank if it is true on any rank (e.g. a stop signal seen by one)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())  # host sync: callers choose when (StopAgreement)


class StopAgreement:
    """When the ranks agree on stopping (a signal or a spot notice seen by one).

    Agreeing costs an all-reduce read on the host (``.item()``): a host sync that drains
    the GPU's queue. So ranks agree only at agreement points: every ``every`` steps, and
    wherever the caller forces one (log steps, checkpoint steps, the last step), which
    depend on the step alone and so come alike on every rank. A stop seen between points
    is taken at the next one: at most ``every - 1`` steps after the step in flight when it
    came. A single process needs no agreement and stops after the current step.
    """

    def __init__(self, info: DistInfo, device: torch.device, every: int) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.info, self.device, self.every = info, device, every

    def is_point(self, step: int, force: bool = False) -> bool:
        return not self.info.enabled or force or step % self.every == 0

    def __call__(self, step: int, local_stop: bool, force: bool = False) -> bool:
        """True on every rank at an agreement point where any rank has seen a stop."""
        if not self.is_point(step, force):
            return False
        return broadcast_flag(local_stop, self.info, self.device)  # host sync (DDP only)


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> None:
    """In place: the mean of ``t`` over all ranks."""
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= info.world_size


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
