"""8-bit AdamW: bitsandbytes' ``AdamW8bit``, without its host sync after every parameter.

bitsandbytes (0.50) ends each parameter's update in ``Optimizer8bit.step`` with
``torch.cuda.synchronize()``: the host waits for the GPU 139 times per optimizer step of
the flagship model, the GPU idling while the next launch is prepared. Its CUDA kernels run
on the legacy default stream (stream 0), the stream torch's work runs on unless a caller
picks another, so in the trainer the updates are ordered after the backward pass that
made the gradients, and before the next forward, by the stream itself: the syncs order
nothing there. This optimizer is bitsandbytes' own, state and checkpoints included (the
same ``state_dict``); only the loop over parameters leaves the syncs out, and falls back
to bitsandbytes' step wherever its reasoning does not hold: paged states (their
prefetches are asynchronous) or a current stream other than the default one.
"""

from __future__ import annotations

import bitsandbytes as bnb
import torch

__all__ = ["AdamW8bit"]


class AdamW8bit(bnb.optim.AdamW8bit):
    """``bitsandbytes.optim.AdamW8bit`` with no host sync per parameter (module doc)."""

    @torch.no_grad()
    def step(self, closure=None):
        if self.is_paged or not _on_default_streams(self.param_groups):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.initialized:
            self.check_overrides()
            self.to_gpu()
            self.initialized = True
        for gindex, group in enumerate(self.param_groups):
            for pindex, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.init_state(group, p, gindex, pindex)
                self.update_step(group, p, gindex, pindex)
        return loss


def _on_default_streams(groups: list[dict]) -> bool:
    """Whether every CUDA device holding a parameter has the legacy default stream (the
    raw stream 0, where bitsandbytes launches its kernels) as its current one (CPU
    parameters: trivially)."""
    devices = {p.device for g in groups for p in g["params"] if p.device.type == "cuda"}
    return all(torch.cuda.current_stream(d).cuda_stream == 0 for d in devices)
