"""8-bit AdamW: bitsandbytes' ``AdamW8bit`` (its states, its ``state_dict``), stepped in a
few launches instead of one per parameter, and without bitsandbytes' host syncs.

bitsandbytes (0.50) updates one tensor per kernel, with Python around each launch, and
ends each parameter's update in ``Optimizer8bit.step`` with ``torch.cuda.synchronize()``:
the host waits for the GPU 139 times per step of the flagship model. On CUDA this class
updates every parameter of a group, dtype and state kind (8-bit, or float32 under
bitsandbytes' size threshold) in one launch of ``ten.kernels.multi_tensor_adamw``, the
same arithmetic on the same states; the step count lives on the device, so a non-finite
step is skipped there too, as torch's fused AdamW skips one (``found_inf``,
``ten.train.nonfinite.step_unless``): no host sync per step at all. The counts are written
back to bitsandbytes' per-parameter ``step`` whenever the state is saved.

Where that path does not apply (CPU parameters, paged states, per-parameter overrides,
bitsandbytes' update-norm clipping or zero skipping) the step is bitsandbytes' own loop
over parameters, without its syncs where its kernels run on the stream that orders them:
bitsandbytes launches on the legacy default stream (stream 0), torch's current stream
unless a caller picks another, so the updates follow the backward pass that made the
gradients by the stream itself; on another stream its own step runs, syncs and all.
"""

from __future__ import annotations

from typing import Any

import bitsandbytes as bnb
import torch

from ten.kernels import multi_tensor_adamw as launches

__all__ = ["AdamW8bit"]

_MOMENTS = {True: ("state1", "state2", "absmax1", "absmax2"), False: ("state1", "state2")}


class AdamW8bit(bnb.optim.AdamW8bit):
    """``bitsandbytes.optim.AdamW8bit`` stepped in one launch per group, dtype and state
    kind (module doc). ``multi_tensor``: None takes that path where every parameter is on
    CUDA; True takes it on any device (the tests, under Triton's interpreter); False never."""

    def __init__(self, params: Any, *args: Any, multi_tensor: bool | None = None,
                 **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.multi_tensor = multi_tensor
        self._launches: dict[tuple, launches.Launch] = {}
        self._no_skip: torch.Tensor | None = None

    @property
    def skips_on_device(self) -> bool:
        """Whether ``step`` reads ``found_inf`` (a 0-dim float tensor on the parameters'
        device) and skips there, as torch's fused AdamW does."""
        if self.is_paged or self.args.max_unorm > 0 or self.args.skip_zeros:
            return False
        if self.mng.pid2config or self.mng.index2config or self.mng.module_weight_config_triple:
            return False
        if self.multi_tensor is not None:
            return self.multi_tensor
        return all(p.device.type == "cuda" for g in self.param_groups for p in g["params"])

    @torch.no_grad()
    def step(self, closure=None):
        if not self.skips_on_device:
            return self._per_parameter_step(closure)
        loss = self._begin(closure)
        skip = getattr(self, "found_inf", None)
        for gindex, group in enumerate(self.param_groups):
            kinds: dict[tuple, list[torch.Tensor]] = {}
            for pindex, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.init_state(group, p, gindex, pindex)
                kinds.setdefault((self.state[p]["state1"].dtype == torch.uint8, p.dtype),
                                 []).append(p)
            for (eight_bit, _), params in kinds.items():
                launch = self._launch(gindex, eight_bit, params)
                if skip is None:
                    skip = self._never_skip(launch.device)
                launches.count_step(launch.steps, skip)
                state = self.state[params[0]]
                maps = (state["qmap1"], state["qmap2"]) if eight_bit else None
                launch.step([p.grad for p in params], skip, maps, lr=group["lr"],
                            betas=group["betas"], eps=group["eps"],
                            weight_decay=group["weight_decay"])
        return loss

    def _begin(self, closure):
        """What bitsandbytes' step does before its updates: the closure's loss, and on the
        first step the overrides found and the states moved to the parameters' device."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.initialized:
            self.check_overrides()
            self.to_gpu()
            self.initialized = True
        return loss

    def _launch(self, gindex: int, eight_bit: bool, params: list[torch.Tensor]
                ) -> launches.Launch:
        """The launch for these parameters, made on first use (its step counts from the
        states'); a changed set of parameters writes the counts back first."""
        key = (gindex, eight_bit, params[0].dtype)
        launch = self._launches.get(key)
        if launch is None or [id(p) for p in launch.params] != [id(p) for p in params]:
            if launch is not None:
                self._write_back_steps()
            launch = launches.Launch(
                params, [[self.state[p][k] for k in _MOMENTS[eight_bit]] for p in params],
                eight_bit, [self.state[p]["step"] for p in params])
            self._launches[key] = launch
        return launch

    def _never_skip(self, device: torch.device) -> torch.Tensor:
        if self._no_skip is None or self._no_skip.device != device:
            self._no_skip = torch.zeros((), device=device)
        return self._no_skip

    def _write_back_steps(self) -> None:
        """The device's step counts into bitsandbytes' per-parameter ``step`` (a host sync:
        where the state is saved, or the parameters stepped change)."""
        for launch in self._launches.values():
            for p, step in zip(launch.params, launch.steps.tolist(), strict=True):
                self.state[p]["step"] = int(step)

    def state_dict(self):
        self._write_back_steps()
        return super().state_dict()

    def load_state_dict(self, state_dict, move_to_device=True):
        super().load_state_dict(state_dict, move_to_device=move_to_device)
        self._launches.clear()  # new state tensors, new step counts

    def _per_parameter_step(self, closure):
        if self.is_paged or not _on_default_streams(self.param_groups):
            return super().step(closure)
        loss = self._begin(closure)
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
