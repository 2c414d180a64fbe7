"""``ten-runner eval``: how well a trained model predicts any text.

The text (a file: plain text whole, or JSONL with a "text" field per line) is tokenized
with the model's own tokenizer, documents separated by EOS as in training, and cut into
windows of the training length and longer (1×, 4×, 16× by default: a recurrent model
should hold up past the length it was trained at). Per length it reports the mean loss
per predicted token, its perplexity, and bits per byte: the loss summed over the
predicted tokens, in bits, over the bytes of text those tokens spell. Perplexity depends
on the tokenizer (a bigger vocabulary predicts fewer, harder tokens); bits per byte does
not, so it is the number to compare models with different tokenizers by.

``--per-document`` scores each document alone instead: from an empty state with EOS as
its first input (a document follows an EOS in training), every token of it predicted,
its bytes those of its text. That is the definition lm-evaluation-harness's rolling
log-likelihood tasks (wikitext and the like) use, so the two report the same bits per
byte on the same file.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.trained import MAX_TOKENS


class TooShort(UserError):
    """The text cannot fill one window of the length asked for."""


@dataclass(frozen=True)
class Score:
    length: int | None  # tokens per window; None: whole documents
    tokens: int  # predicted tokens counted
    bytes: int  # bytes of text they spell
    available: int  # predicted tokens the text holds at this length (max_tokens cuts it)
    loss: float  # nats per predicted token
    perplexity: float
    bits_per_byte: float


def read_documents(path: Path) -> list[str]:
    """A .jsonl file's "text" fields, else the whole file as one document."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path}: {type(e).__name__}: {e}") from None
    if Path(path).suffix != ".jsonl":
        docs = [raw]
    else:
        docs = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line)["text"])
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{path}:{n}: not a JSON object with a \"text\" string") \
                    from None
    if not any(d.strip() for d in docs if isinstance(d, str)):
        raise UserError(f"{path} holds no text to evaluate on")
    return [d for d in docs if isinstance(d, str)]


def piece_bytes(tokenizer: Any) -> list[int]:
    """Bytes of text each token id spells: its piece with "▁" as a space, a byte-fallback
    piece one byte, control pieces (EOS, ...) none."""
    sp = tokenizer._sp
    sizes = []
    for i in range(tokenizer.vocab_size):
        piece = sp.id_to_piece(i)
        if sp.is_control(i) or sp.is_unknown(i):
            sizes.append(0)
        elif sp.is_byte(i):
            sizes.append(1)
        else:
            sizes.append(len(piece.replace("\u2581", " ").encode("utf-8")))
    return sizes


def score(model: Any, tokenizer: Any, documents: list[str], length: int,
          max_tokens: int, batch_size: int = 4) -> Score:
    """Mean loss over windows of ``length`` predicted tokens (each window starts with an
    empty state), at most ``max_tokens`` of them, from the start of the text."""
    import torch
    import torch.nn.functional as F

    stream = torch.as_tensor(tokenizer.encode_documents(documents).astype("int64"))
    available = (len(stream) - 1) // length
    windows = min(available, max(1, max_tokens // length))
    if windows < 1:
        raise TooShort(f"the text is {len(stream)} tokens: too short for one window of "
                       f"{length}; give more text or a shorter --seq-len")
    sizes = torch.tensor(piece_bytes(tokenizer))
    x = stream[: windows * length + 1]
    inputs = x[:-1].view(windows, length)
    targets = x[1:].view(windows, length)
    nll = 0.0
    with torch.no_grad():
        for i in range(0, windows, batch_size):
            logits, _ = model(inputs[i:i + batch_size])
            nll += F.cross_entropy(logits.float().flatten(0, 1),
                                   targets[i:i + batch_size].flatten(), reduction="sum").item()
    return _score(length, nll, targets.numel(), int(sizes[targets].sum()),
                  available * length)


def score_documents(model: Any, tokenizer: Any, documents: list[str], chunk: int,
                    max_tokens: int) -> Score:
    """Each document alone (see the module doc), read ``chunk`` tokens at a time with
    the model's state carried; documents in order until ``max_tokens`` are predicted."""
    import torch
    import torch.nn.functional as F

    nll, tokens, nbytes, available = 0.0, 0, 0, 0
    with torch.no_grad():
        for text in documents:
            ids = tokenizer.encode(text)
            available += len(ids)
            if not ids or tokens >= max_tokens:
                continue
            inputs, targets = torch.tensor([[tokenizer.eos_id, *ids[:-1]]]), torch.tensor(ids)
            state = None
            for start in range(0, len(ids), chunk):
                logits, state = model(inputs[:, start:start + chunk], state)
                nll += F.cross_entropy(logits[0].float(), targets[start:start + chunk],
                                       reduction="sum").item()
            tokens, nbytes = tokens + len(ids), nbytes + len(text.encode("utf-8"))
    if not tokens:
        raise UserError("no document holds a token to score")
    return _score(None, nll, tokens, nbytes, available)


def _score(length: int | None, nll: float, tokens: int, nbytes: int, available: int) -> Score:
    """The summed loss ``nll`` (nats) over ``tokens`` predicted tokens spelling
    ``nbytes`` bytes, of ``available`` the text holds, as a Score."""
    from runner.trained.sample import ppl

    loss = nll / tokens
    return Score(length=length, tokens=tokens, bytes=nbytes, available=available, loss=loss,
                 perplexity=ppl(loss), bits_per_byte=nll / math.log(2) / max(nbytes, 1))


def evaluate(target: str, data: Path, seq_len: int | None, max_tokens: int, as_json: bool,
             per_document: bool = False, **run: Any) -> str:
    """The report for a folder ``export-model`` wrote, or a run (``run``: job,
    endpoint_url, step, as :func:`runner.trained.sample.trained_model` takes them)."""
    from runner.trained.hf_folder import load_exported
    from runner.trained.sample import run_tokenizer, trained_model

    if (Path(target) / "model.safetensors").is_file():
        model, tokenizer = load_exported(Path(target))
        name = Path(target).name
    else:
        run_dir, job, found, model = trained_model(target, **run)
        tokenizer, name = run_tokenizer(run_dir, found), f"{job} step {found.step}"
    length = seq_len or model.config.seq_len
    if per_document:
        scores = [score_documents(model, tokenizer, read_documents(data), length, max_tokens)]
        unfilled: list[int] = []
    else:
        scores, unfilled = evaluate_text(model, tokenizer, data, length, max_tokens=max_tokens)
    return report(scores, name, data, as_json, unfilled)


def evaluate_text(model: Any, tokenizer: Any, path: Path, seq_len: int,
                  multiples: tuple[int, ...] = (1, 4, 16), max_tokens: int = MAX_TOKENS
                  ) -> tuple[list[Score], list[int]]:
    """A score per length the text fills a window of, and the lengths it does not; the
    first length must be filled (TooShort otherwise)."""
    documents = read_documents(path)
    scores, unfilled = [], []
    for m in multiples:
        try:
            scores.append(score(model, tokenizer, documents, seq_len * m, max_tokens))
        except TooShort:
            if not scores:
                raise
            unfilled.append(seq_len * m)
    return scores, unfilled


def _how_much(s: Score) -> str:
    """What a score counted, and that it is the text's start when --max-tokens cut it."""
    if s.tokens >= s.available:
        return f"{s.tokens:,} tokens, {s.bytes:,} bytes: all of the text"
    return (f"the first {s.tokens:,} of {s.available:,} tokens, {s.bytes:,} bytes; "
            "--max-tokens scores more")


def report(scores: list[Score], name: str, path: Path, as_json: bool,
           unfilled: list[int] | None = None) -> str:
    """The lines (or JSON) a user reads; a longer length the text could not fill is said
    (``unfilled``), not left out silently."""
    first, unfilled = scores[0], unfilled or []
    if as_json:
        return json.dumps({"model": name, "data": str(path), "loss": first.loss,
                           "perplexity": first.perplexity,
                           "bits_per_byte": first.bits_per_byte,
                           "by_length": [asdict(s) for s in scores],
                           "too_short_for": unfilled}, indent=1)
    lines = [f"{name} on {path}:"]
    lines += [f"  {'whole documents' if s.length is None else f'length {s.length:>6}'}: "
              f"loss {s.loss:.4f}, perplexity {s.perplexity:.2f}, bits per byte "
              f"{s.bits_per_byte:.4f} ({_how_much(s)})" for s in scores]
    lines += [f"  length {length:>6}: the text is too short for one window (give more "
              "text)" for length in unfilled]
    lines.append("perplexity depends on the tokenizer; bits per byte compares models "
                 "across tokenizers")
    return "\n".join(lines)
