"""Which job key sets which library field: the one place that knows.

The library (``ten``) names its fields by config class (``DataConfig.seq_len``,
``TrainConfig.lr``, ``TENConfig.scan_backend``) in its errors and hints;
:func:`in_job_terms` rewrites those names into the keys a job file sets
(``data.seq_len``, ``train.lr``, ``model.scan_backend``). The job's schema builds its
sections by these tables (``runner/job/schema.py``), the job's library configs are read
back through them (``runner/job/library.py``), and every ``UserError`` speaks in job keys
by them (``runner/errors.py``). Imports nothing of the runner: the floor all three stand on.
"""

from __future__ import annotations

import re

# TrainConfig fields the job keeps outside its train section: field -> (section, key).
# Every other TrainConfig field is train.<field>.
FROM_OTHER_SECTIONS = {"num_workers": ("data", "num_workers"),
                       "checkpoint_every": ("checkpoint", "every_steps"),
                       "keep_last": ("checkpoint", "keep_last")}
# DataConfig's seed is the job's train.seed (one seed for the model and the data).
DATA_FROM_OTHER_SECTIONS = {"seed": ("train", "seed")}
# DataConfig fields no job sets: the library's knobs, at their defaults in every run.
DATA_NOT_IN_JOBS = frozenset({"shard_tokens", "verify_checksums", "stream_block_docs",
                              "stream_block_chars", "progress"})
# Model fields a job does not set in its model section: the data decides them.
MODEL_FROM_OTHER_SECTIONS = {"seq_len": ("data", "seq_len"),
                             "vocab_size": ("data", "tokenizer", "vocab_size")}
MODEL_CONFIGS = ("TENConfig", "TransformerConfig")


def job_key(config: str, field: str) -> str | None:
    """The job key that sets ``config``'s ``field`` (dotted for a nested config:
    ``("DataConfig", "tokenizer.path")`` -> ``data.tokenizer.path``); None for a field a
    job does not set (``DataConfig.shard_tokens``)."""
    head = field.split(".", 1)[0]
    if config == "TrainConfig":
        return ".".join(FROM_OTHER_SECTIONS.get(field, ("train", field)))
    if config == "TokenizerConfig":
        return f"data.tokenizer.{field}"
    if config == "DataConfig":
        if field in DATA_FROM_OTHER_SECTIONS:
            return ".".join(DATA_FROM_OTHER_SECTIONS[field])
        return None if head in DATA_NOT_IN_JOBS else f"data.{field}"
    if config in MODEL_CONFIGS:
        return ".".join(MODEL_FROM_OTHER_SECTIONS.get(field, ("model", field)))
    return None


LIBRARY_CONFIGS = ("TrainConfig", "DataConfig", "TokenizerConfig", *MODEL_CONFIGS)
_FIELD = re.compile(rf"\b({'|'.join(LIBRARY_CONFIGS)})((?:\.[a-z_][a-z0-9_]*)+)")


def in_job_terms(text: str) -> str:
    """``text`` with each library field it names (``DataConfig.text_field``) replaced by
    the job key that sets it (``data.text_field``); a field no job key sets is kept."""
    def key(m: re.Match[str]) -> str:
        return job_key(m.group(1), m.group(2)[1:]) or m.group(0)

    return _FIELD.sub(key, text)
