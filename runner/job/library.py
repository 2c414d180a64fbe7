"""The job's sections as the library's config objects: each field from the job key
``runner.keys`` names for it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from runner.keys import FROM_OTHER_SECTIONS
from ten.config import TrainConfig
from ten.data.config import DataConfig, TokenizerConfig

if TYPE_CHECKING:
    from runner.job import Job


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
