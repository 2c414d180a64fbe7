"""What a glance at a job's local data tells before anything is spent.

``validate`` and ``run`` (on the machine that trains) read a small local corpus whole,
with the library's own reader, tokenizer and held-out split, and say now what training
would otherwise find after its tokenizer and first steps: a missing text field, no
text at all, a vocabulary larger than the text can fill, a training split shorter than
one batch, a held-out split shorter than one evaluation batch. The tokenizer is the one
``run`` uses (same cache key), so the glance costs ``run`` nothing. A larger corpus gets
its first record checked only: reading it whole is the run's job.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from runner.job.library import data_config
from runner.keys import in_job_terms

Path_ = tuple[str | int, ...]
Found = list[tuple[Path_, str]]
# Read whole (and train the tokenizer on) local corpora up to this size: seconds.
PEEK_BYTES = 4 << 20


@dataclass
class Split:
    documents: int = 0
    tokens: int = 0  # as the shards hold them: each document's ids and its EOS


def local_data(job: Any) -> Found:
    """Problems training would meet in the job's local corpus (none for a hub name or the
    builtin corpus, which the library checks as it reads them)."""
    from ten.data import DataError
    from ten.data.sources import is_local, open_source

    cfg = data_config(job)
    if not is_local(cfg.dataset):
        return []
    try:
        source = open_source(cfg.dataset, cfg.text_field, cfg.cache_path)
        if (source.total_bytes() or 0) > PEEK_BYTES:
            next(source.documents(), None)  # the first record: its text field
            return []
        train, val = _splits(cfg, source)
    except DataError as e:
        message = in_job_terms(str(e))
        return [(_key_named(message), message)]
    return _too_short(job, train, val)


def _key_named(message: str) -> Path_:
    """The data key a library message tells the user to change, else ``data.dataset``."""
    from runner.job.errors import section_fields
    from runner.job.schema import JobSchema

    for m in re.finditer(r"\bdata((?:\.[a-z_]+)+)", message):
        path = ("data", *m.group(1)[1:].split("."))
        if path[-1] in (section_fields(JobSchema, path[:-1]) or ()):
            return path
    return ("data", "dataset")


def _splits(cfg: Any, source: Any) -> tuple[Split, Split]:
    """The train and held-out splits' sizes in tokens, as the shards would hold them."""
    from ten.data.pipeline import open_tokenizer
    from ten.data.sources import is_val, usable

    tokenizer = open_tokenizer(cfg, source)  # DataError: a vocabulary too large, ...
    fraction = source.val_fraction(cfg.val_fraction)
    texts: dict[bool, list[str]] = {False: [], True: []}
    for key, text in itertools.islice(source.documents(), cfg.max_documents):
        if usable(text):
            texts[is_val(key, fraction)].append(text)
    train, val = (Split(len(t), sum(len(ids) + 1 for ids in tokenizer.encode_batch(t)))
                  for t in (texts[False], texts[True]))
    return train, val


def _too_short(job: Any, train: Split, val: Split) -> Found:
    """A batch takes ``batch_size x seq_len`` tokens plus the one its last target needs
    (the trainer's rule); the held-out split must fill one at the end of every run."""
    d, t = job.data, job.train
    ranks = max(1, job.resources.gpus)
    found: Found = []
    if train.documents + val.documents == 0:
        return [(("data", "dataset"), "has no non-empty documents")]
    batch = t.batch_size * ranks * d.seq_len + 1
    if train.tokens < batch:
        found.append((("data", "dataset"), (
            f"the training split holds {train.tokens:,} tokens ({_documents(train)}), "
            f"fewer than one batch: train.batch_size x data.seq_len"
            + (f" x {ranks} GPUs" if ranks > 1 else "") + f" + 1 = {batch:,} (hint: give "
            "more text, or lower train.batch_size or data.seq_len)")))
    need = t.batch_size * d.seq_len + 1
    if val.tokens < need:
        found.append((("data", "val_fraction"), (
            f"holds out {_documents(val)}, {val.tokens:,} tokens: fewer than the "
            f"one evaluation batch every run ends with, train.batch_size x data.seq_len + 1 "
            f"= {need:,} (hint: raise data.val_fraction, or lower train.batch_size or "
            "data.seq_len)")))
    return found


def _documents(split: Split) -> str:
    return f"{split.documents:,} document" + ("" if split.documents == 1 else "s")
