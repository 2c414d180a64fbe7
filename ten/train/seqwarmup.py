"""Sequence-length warm-up: the first steps train on shorter sequences, with the same
tokens per step.

The loader keeps yielding its (B, T + 1) windows of the packed stream, and its cursor
does not change; a step of the warm-up cuts each window into T / L rows of L + 1 tokens
that overlap by one (the last target of a row is the first input of the next), so it
predicts exactly the tokens, from the same data, that the full window would: B x T of
them. Only the context each prediction sees is shorter. The length is a function of the
step alone, so a resume in the middle of the warm-up is bit-exact with nothing more in
the checkpoint.

The schedule: lengths ``start, 2 start, 4 start, ...`` up to (not including) T, each for
an equal share of ``steps`` steps, then T. Why: recurrent models learn to use their
state on short sequences first (the project's recall results needed a 64 -> 256
curriculum), and the speed-run records of GPT-2 schedule the length too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def lengths(seq_len: int, start: int) -> list[int]:
    """The warm-up's sequence lengths, shortest first, ``seq_len`` last; ValueError (one
    line) unless ``seq_len`` is ``start`` times a power of two greater than one."""
    if start < 1 or start >= seq_len or seq_len % start or (seq_len // start) & (
            seq_len // start - 1):
        raise ValueError(f"must be DataConfig.seq_len ({seq_len}) over a power of two "
                         f"(e.g. {seq_len // 4})")
    out = [start]
    while out[-1] < seq_len:
        out.append(out[-1] * 2)
    return out


def length_at(step: int, seq_len: int, start: int | None, steps: int) -> int:
    """The sequence length step ``step`` (1-based) trains on."""
    if start is None or step > steps:
        return seq_len
    shorter = lengths(seq_len, start)[:-1]
    return shorter[(step - 1) * len(shorter) // steps]


def split_rows(batch: torch.Tensor, length: int) -> torch.Tensor:
    """(B, T + 1) windows as (B x T / length, length + 1) rows that predict the same
    B x T tokens (see the module doc)."""
    rows, width = batch.shape
    per_row = (width - 1) // length
    if per_row * length != width - 1:
        raise ValueError(f"a window of {width - 1} tokens does not split into rows of "
                         f"{length}")
    if per_row == 1:
        return batch
    import torch

    index = (torch.arange(per_row, device=batch.device)[:, None] * length
             + torch.arange(length + 1, device=batch.device))
    return batch[:, index].reshape(rows * per_row, length + 1)
