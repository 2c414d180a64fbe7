"""What survives a restart, outside the loop: RNG states as tensors, a checkpoint's
config and trainer state checked before use, the identity a resume must keep, and a
model rebuilt from a checkpoint.

Everything here loads with ``weights_only=True`` (ten.checkpoint): a damaged or tampered
file raises ``CheckpointError`` in one line, never a KeyError or a pickle that runs code.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ten import checkpoint as ckpt
from ten.lm import LanguageModel
from ten.presets import EXECUTION_FIELDS, build_model


def rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and plain containers, so a checkpoint loads with
    ``weights_only=True`` (numpy's own state holds an ndarray, which would not)."""
    np_state = np.random.get_state(legacy=False)
    state = {"python": random.getstate(),
             "numpy": {"bit_generator": np_state["bit_generator"],
                       # the MT19937 key is uint32: int64 holds it exactly
                       "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                       "pos": int(np_state["state"]["pos"]),
                       "has_gauss": int(np_state["has_gauss"]),
                       "gauss": float(np_state["gauss"])},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted-path differences between two JSON-like values, as 'path: old -> new'."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            path = f"{prefix}.{key}" if prefix else str(key)
            out += config_diff(old.get(key), new.get(key), path)
        return out
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]


def read_config(path: Path) -> dict[str, Any]:
    """A checkpoint's ``config.json``; CheckpointError (one line) when it is unreadable or
    lacks a field, so a damaged one counts as a corrupt checkpoint, never a KeyError."""
    try:
        saved = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ckpt.CheckpointError(f"{path}: unreadable config.json "
                                   f"({type(e).__name__}: {first_line(e)})") from None
    fields = (("identity", dict), ("resolved", dict), ("model_config", dict),
              ("model_class", str))
    if not isinstance(saved, dict):
        raise ckpt.CheckpointError(f"{path}: config.json is not a JSON object (corrupt)")
    bad = [name for name, kind in fields if not isinstance(saved.get(name), kind)]
    if bad:
        raise ckpt.CheckpointError(f"{path}: config.json lacks {', '.join(bad)} (corrupt)")
    return saved


def check_trainer_state(path: Path, state: Any, step: int) -> None:
    """trainer.pt's fields and types, before any is used (a damaged file is corrupt)."""
    fields = (("step", int), ("tokens", int), ("scheduler", dict), ("scaler", dict),
              ("rng", dict), ("data", dict))
    if not isinstance(state, dict):
        raise ckpt.CheckpointError(f"{path}: trainer.pt is not a dict (corrupt)")
    bad = [name for name, kind in fields if not isinstance(state.get(name), kind)]
    if bad:
        raise ckpt.CheckpointError(f"{path}: trainer.pt lacks {', '.join(bad)} (corrupt)")
    if state["step"] != step:
        raise ckpt.CheckpointError(f"{path}: trainer.pt is for step {state['step']} (corrupt)")


def model_proper(identity: dict[str, Any]) -> dict[str, Any]:
    """The identity without the model fields that change how it computes, not what
    (ten.presets.EXECUTION_FIELDS): a resume may turn on checkpointing to fit a smaller
    GPU, or land where another scan backend runs."""
    model = identity.get("model")
    if not isinstance(model, dict):
        return identity
    return {**identity, "model": {k: v for k, v in model.items() if k not in EXECUTION_FIELDS}}


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def load_model(checkpoint_dir: Path, device: str | torch.device = "cpu") -> LanguageModel:
    """Rebuild the model a checkpoint was saved from and load its weights; a damaged or
    refused checkpoint raises CheckpointError (one line)."""
    from ten.model import TENConfig
    from ten.transformer import TransformerConfig

    path = Path(checkpoint_dir)
    saved = read_config(path)
    cls = TENConfig if saved["model_class"] == "TENLM" else TransformerConfig
    try:
        model = build_model(cls(**saved["model_config"])).to(device)
        model.load_state_dict(ckpt.load(path, "model.pt", device))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ckpt.CheckpointError(f"{path}: the model does not load "
                                   f"({type(e).__name__}: {first_line(e)})") from None
    return model.eval()
