"""The health of a TEN's complex state, per layer, from one held-out batch.

Three figures per layer, logged at each evaluation (the "state" records, and so in
TensorBoard), so a run whose state degenerates shows it while it trains:

- ``decay_p10/p50/p90``: |λ| = exp(-exp(ν)·Δ) over eigenstates (and, selective, over the
  batch's tokens): how much of the state survives a step. All near 1, the layer no
  longer forgets; all near 0, it remembers nothing.
- ``step_p10/p50/p90`` (selective only): the step Δ_t itself, the input's control of it.
- ``imag_share``: the imaginary part's share of the state's energy after the batch,
  Σ im² / Σ (re² + im²). Complex recurrent LMs have been seen to collapse to their real
  part (the share falls to 0): the rotation, and what it encodes of position, is lost.

docs/model.md gives the recurrence these come from.
"""

from __future__ import annotations

from typing import Any

import torch

QUANTILES = (0.1, 0.5, 0.9)
MAX_SAMPLES = 1 << 20  # values per quantile: a strided sample of the batch beyond this


@torch.no_grad()
def state_health(model: Any, ids: torch.Tensor) -> dict[str, float]:
    """``{"L<i>/decay_p50": ..., "L<i>/imag_share": ..., ...}`` for every layer of a TEN
    language model after reading ``ids`` (B, T); {} for a model without eigenstates."""
    blocks = getattr(model, "blocks", [])
    if not blocks or not hasattr(blocks[0].mixer, "nu"):
        return {}
    steps: dict[int, torch.Tensor] = {}
    hooks = [block.mixer.register_forward_hook(  # inputs: (xn, state), from the start here
        lambda mixer, inputs, out, i=i: steps.__setitem__(
            i, mixer.steps_from_start(inputs[0]).float()))
        for i, block in enumerate(blocks) if block.mixer.delta is not None]
    was_training = model.training
    model.eval()
    try:
        # eagerly under train.compile: compiled blocks run without the hooks (their guards
        # do not see them), and compiling again for a figure is minutes of a GPU run
        with torch.compiler.set_stance("force_eager"):
            _, state = model.hidden_states(ids)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    out: dict[str, float] = {}
    for i, block in enumerate(blocks):
        rate = torch.exp(block.mixer.nu.float())  # -log|λ| per unit step, (K,)
        step = steps.get(i)
        out |= _quantiles(f"L{i}/decay", torch.exp(-rate * (1.0 if step is None else step)))
        if step is not None:
            out |= _quantiles(f"L{i}/step", step)
        eig = state[i][0] if isinstance(state[i], tuple) else state[i]
        # a vector state: (B, 2K) as re | im; a matrix state: (B, H, K/H, P) complex
        re, im = (eig.real, eig.imag) if eig.is_complex() else eig.float().chunk(2, dim=-1)
        energy = float((re.square().sum() + im.square().sum()).clamp_min(1e-30))
        out[f"L{i}/imag_share"] = float(im.square().sum()) / energy
    return out


def _quantiles(name: str, values: torch.Tensor) -> dict[str, float]:
    flat = values.flatten()
    if flat.numel() > MAX_SAMPLES:
        flat = flat[:: flat.numel() // MAX_SAMPLES + 1]
    q = torch.quantile(flat, torch.tensor(QUANTILES, device=flat.device))
    return {f"{name}_p{round(100 * p)}": float(v) for p, v in zip(QUANTILES, q, strict=True)}
