"""An optimizer's saved state in the form of the optimizer that loads it, so a run resumes
under the other of the job's two optimizers (``train.optimizer``: ``adamw``, torch's AdamW
with float32 moments, or ``adamw8bit``, bitsandbytes' with 8-bit ones) keeping its moments
and step counts. Without it the resume loaded and then died at its first step with a bare
``KeyError: 'exp_avg'`` (or ``'state1'``).

The two keep the same moments in different layouts. Torch's AdamW: per parameter ``step``
(a float tensor), ``exp_avg`` and ``exp_avg_sq`` in float32. bitsandbytes': ``step`` (an
int), ``state1`` and ``state2`` (the same two moments), each either float32 (parameters
under its size threshold) or uint8 codes into a dynamic map (``qmap1`` / ``qmap2``) scaled
per block of 256 (``absmax1`` / ``absmax2``); its ``state_dict`` (0.50) nests those under
one key of the entry, where earlier releases kept them beside ``step``. Converting to
float32 decodes the blocks; converting to 8 bits encodes them as bitsandbytes' own step
would (its 8-bit rounding, ~1% of a moment). The parameter groups are the loading
optimizer's own (its flags: ``fused`` decides how a non-finite step is skipped,
``ten.train.nonfinite``) with the saved learning rates, which the schedule set.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["for_optimizer"]

BLOCK = 256  # bitsandbytes' 8-bit optimizers quantize their states in blocks of this many
NESTED = "__bnb_optimizer_quant_state__"  # where bitsandbytes 0.50's state_dict puts them


def for_optimizer(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``saved`` (an optimizer's ``state_dict``) as ``optimizer`` loads it: ``saved`` itself
    where its moments are in the optimizer's form already (a resume stays bit-exact), else
    converted. Raises ValueError for a state this cannot place (another parameter grouping
    or layout). Converting to 8 bits makes ``optimizer``'s fresh states through
    bitsandbytes' own ``init_state``; load the result straight after."""
    eight_bit = any("state1" in _bnb(s) for s in saved["state"].values())
    wanted_8bit = not isinstance(optimizer, torch.optim.AdamW)  # bitsandbytes' is not one
    if not saved["state"] or eight_bit == wanted_8bit:
        return saved
    if len(saved["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"the saved optimizer has {len(saved['param_groups'])} parameter "
                         f"groups, this run's {len(optimizer.param_groups)}")
    state = _to_8bit(saved, optimizer) if wanted_8bit else _to_float32(saved)
    out = optimizer.state_dict()  # its groups: this run's hyperparameters and flags
    for group, was in zip(out["param_groups"], saved["param_groups"], strict=True):
        group.update({k: was[k] for k in ("lr", "initial_lr") if k in was})
    out["state"] = state
    return out


def _to_float32(saved: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {i: {"step": torch.tensor(float(s["step"])), "exp_avg": _decoded(s, 1),
                "exp_avg_sq": _decoded(s, 2)} for i, s in saved["state"].items()}


def _bnb(entry: dict[str, Any]) -> dict[str, Any]:
    """A saved bitsandbytes entry's state tensors, nested or not."""
    return entry.get(NESTED, entry)


def _decoded(entry: dict[str, Any], k: int) -> torch.Tensor:
    """Moment ``k`` (1: the mean, 2: the mean square) of a bitsandbytes state, float32."""
    entry = _bnb(entry)
    codes = entry[f"state{k}"]
    if codes.dtype != torch.uint8:
        return codes.float()
    import bitsandbytes.functional as F

    _check_blocks(codes, entry[f"absmax{k}"])
    return F.dequantize_blockwise(codes, absmax=entry[f"absmax{k}"], code=entry[f"qmap{k}"],
                                  blocksize=BLOCK)


def _to_8bit(saved: dict[str, Any], optimizer: Any) -> dict[int, dict[str, Any]]:
    import bitsandbytes.functional as F

    params = [(g, gi, pi, p) for gi, g in enumerate(optimizer.param_groups)
              for pi, p in enumerate(g["params"])]
    for i, s in saved["state"].items():
        group, gindex, pindex, p = params[i]
        optimizer.init_state(group, p, gindex, pindex)  # 8 or 32 bits, by its own rule
        entry = optimizer.state[p]
        entry["step"] = int(s["step"])
        for k, moment in ((1, s["exp_avg"]), (2, s["exp_avg_sq"])):
            codes = entry[f"state{k}"]
            moment = moment.to(device=codes.device, dtype=torch.float32)
            if codes.dtype != torch.uint8:
                codes.copy_(moment)
                continue
            _check_blocks(codes, entry[f"absmax{k}"])
            F.quantize_blockwise(moment, code=entry[f"qmap{k}"], absmax=entry[f"absmax{k}"],
                                 out=codes, blocksize=BLOCK)
    states = optimizer.state_dict()["state"]
    optimizer.state.clear()  # what load_state_dict replaces
    return states


def _check_blocks(codes: torch.Tensor, absmax: torch.Tensor) -> None:
    if absmax.numel() != math.ceil(codes.numel() / BLOCK):
        raise ValueError(f"an 8-bit state of {codes.numel()} codes has {absmax.numel()} "
                         f"block scales, not one per {BLOCK}")
