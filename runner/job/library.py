"""The job's sections as the library's config objects, and the library's field names as
the job's keys: the one place that knows which job key holds which library field.

The library (``ten``) names its fields by config class (``DataConfig.seq_len``,
``TrainConfig.lr``, ``TENConfig.scan_backend``) in its errors and hints;
:func:`in_job_terms` rewrites those names into the keys a job file sets
(``data.seq_len``, ``train.lr``, ``model.scan_backend``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from ten.config import TrainConfig
from ten.data.config import DataConfig, TokenizerConfig

if TYPE_CHECKING:
    from runner.job import Job


# TrainConfig fields the job keeps outside its train section: field -> (section, key).
# Every other TrainConfig field is train.<field>.
FROM_OTHER_SECTIONS = {"num_workers": ("data", "num_workers"),
                       "checkpoint_every": ("checkpoint", "every_steps"),
                       "keep_last": ("checkpoint", "keep_last")}
# DataConfig's seed is the job's train.seed (one seed for the model and the data).
DATA_FROM_OTHER_SECTIONS = {"seed": ("train", "seed")}
# Model fields a job does not set in its model section: the data decides them.
MODEL_FROM_OTHER_SECTIONS = {"seq_len": ("data", "seq_len"),
                             "vocab_size": ("data", "tokenizer", "vocab_size")}
MODEL_CONFIGS = ("TENConfig", "TransformerConfig")


def data_config(job: Job) -> DataConfig:
    """The job's DataConfig: each field from the data section's key of the same name (the
    tokenizer from its nested section), the seed from train.seed."""
    section = job.data.model_dump()
    values = {f.name: section[f.name] for f in dataclasses.fields(DataConfig)
              if f.name in section}
    values["tokenizer"] = TokenizerConfig(**values["tokenizer"])
    values["seed"] = job.train.seed
    return DataConfig(**values)


def train_config(job: Job) -> TrainConfig:
    """Every TrainConfig field from the train section's key of the same name, or from the
    section :data:`FROM_OTHER_SECTIONS` names."""
    values = {}
    for f in dataclasses.fields(TrainConfig):
        section, key = FROM_OTHER_SECTIONS.get(f.name, ("train", f.name))
        values[f.name] = getattr(getattr(job, section), key)
    return TrainConfig(**{**values, "betas": tuple(values["betas"])})


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
        from runner.job.schema import DataSection

        return f"data.{field}" if head in DataSection.model_fields else None
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
