"""The job's sections as the library's config objects (ten.data.DataConfig,
ten.config.TrainConfig), built by field name: one set of names and defaults."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ten.config import TrainConfig

if TYPE_CHECKING:
    from runner.job import Job


# TrainConfig fields the job keeps outside its train section: field -> (section, key).
# The one place that knows; every other TrainConfig field is train.<field>.
FROM_OTHER_SECTIONS = {"num_workers": ("data", "num_workers"),
                       "checkpoint_every": ("checkpoint", "every_steps"),
                       "keep_last": ("checkpoint", "keep_last")}


def data_config(job: Job):
    """The data layer's DataConfig for this job (one mapping: :meth:`Job.data_config`)."""
    return job.data_config()


def train_config(job: Job) -> TrainConfig:
    """Every TrainConfig field from the train section's key of the same name, or from the
    section :data:`FROM_OTHER_SECTIONS` names."""
    values = {}
    for f in dataclasses.fields(TrainConfig):
        section, key = FROM_OTHER_SECTIONS.get(f.name, ("train", f.name))
        values[f.name] = getattr(getattr(job, section), key)
    return TrainConfig(**{**values, "betas": tuple(values["betas"])})
