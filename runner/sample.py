"""Text from a trained model: the end-of-run sample and ``ten-runner sample``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def ppl(loss: float) -> float:
    import math

    return math.exp(min(loss, 50.0))


def generate_text(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int,
                  temperature: float, top_k: int | None, seed: int) -> str:
    import torch

    device = next(model.parameters()).device
    ids = tokenizer.encode(prompt) or [tokenizer.eos_id]
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(torch.tensor([ids], device=device), max_new_tokens,
                         temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0].tolist())


def sample_run(run_dir: str | Path, prompt: str, max_new_tokens: int, temperature: float,
               top_k: int, seed: int) -> str:
    """Text generated from the newest valid checkpoint of a run directory."""
    from runner.errors import UserError
    from ten import checkpoint as ckpt
    from ten.data import Tokenizer
    from ten.trainer import load_model

    run_dir = Path(run_dir)
    found = ckpt.latest_valid(run_dir / "checkpoints", report=lambda s: print(s, file=sys.stderr))
    if found is None:
        raise UserError(f"no committed checkpoint under {run_dir / 'checkpoints'}; "
                        "run the job first (ten-runner run JOB.yaml)")
    tok_path = run_dir / "tokenizer.model"
    if not tok_path.is_file():
        raise UserError(f"{tok_path} is missing; it is written when the job starts")
    model = load_model(found.path)
    text = generate_text(model, Tokenizer(tok_path), prompt, max_new_tokens, temperature,
                         top_k, seed)
    return f"[{run_dir.name} step {found.step}] {text}"
