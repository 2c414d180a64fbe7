"""A recall probe beside the held-out loss: does the model use what it has read?

Perplexity can fall while a recurrent model forgets everything beyond a few tokens; what
separates recurrent models from attention is recall (Zoology). The probe: a stretch of
random tokens, then the same stretch again. Random tokens carry no language, so the
model can predict the repeat only by recalling the first copy; the score is the share
of the repeat's tokens it predicts (greedy), chance being 1 / V. A model that recalls
scores near 1 at short stretches and falls off as the stretch outgrows its memory.

Cheap by construction: a few rows of at most :data:`MAX_TOKENS` tokens, one forward
pass, and the head applied a chunk of positions at a time (no rows x T x V logits).
The rows are seeded: every evaluation of a run scores the same sequences.
"""

from __future__ import annotations

import torch

from ten.model.lm import LanguageModel

MAX_TOKENS = 2048  # the probe's longest sequence, whatever the training length
ROWS = 4
FIRST_ID = 4  # pad, unk, bos, eos come first in the project's tokenizers
SEED = 20261126
HEAD_CHUNK = 512  # positions per application of the head


@torch.no_grad()
def repeat_recall(model: LanguageModel, seq_len: int, device: torch.device,
                  amp_dtype: torch.dtype | None = None) -> float:
    """The share of the repeated half's tokens the model predicts, over :data:`ROWS`
    rows of ``min(seq_len, MAX_TOKENS)`` tokens (the first token of the repeat, which
    nothing announces, is not scored)."""
    vocab = model.config.vocab_size
    half = min(seq_len, MAX_TOKENS) // 2
    generator = torch.Generator().manual_seed(SEED)
    first = torch.randint(FIRST_ID, vocab, (ROWS, half), generator=generator)
    ids = torch.cat([first, first], dim=1).to(device)
    was_training = model.training
    model.eval()
    try:
        # eagerly under train.compile: the probe's rows and length are not a batch's, and
        # compiling the blocks again for them is minutes of a GPU run
        with torch.compiler.set_stance("force_eager"), \
                torch.autocast(device.type, dtype=amp_dtype or torch.float32,
                               enabled=amp_dtype is not None):
            hidden, _ = model.hidden_states(ids[:, :-1])
        hidden = hidden[:, half:]  # the positions that predict the repeat's 2nd token on
        targets = ids[:, half + 1:]
        right = 0
        for start in range(0, hidden.shape[1], HEAD_CHUNK):
            h = hidden[:, start:start + HEAD_CHUNK].float()
            guess = (h @ model.output_weight.float().t()).argmax(-1)
            right += int((guess == targets[:, start:start + HEAD_CHUNK]).sum())
    finally:
        model.train(was_training)
    return right / targets.numel()
