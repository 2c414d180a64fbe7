"""The seam between a job and the library: one set of names and defaults (ten.config),
and the library's configs built from a job by field name."""

import dataclasses

from runhelpers import MINIMAL_JOB

from runner.job import parse_job
from runner.job.library import train_config
from runner.job.schema import JobSchema
from ten.config import FROM_OTHER_SECTIONS, TrainConfig

MINIMAL = MINIMAL_JOB


def test_a_job_that_sets_nothing_trains_with_the_library_defaults():
    job = parse_job(MINIMAL, check_model=False)
    assert train_config(job) == TrainConfig(max_steps=10)


def test_every_key_reaches_the_library_under_its_own_name():
    job = parse_job(MINIMAL, check_model=False, sets=[
        "train.lr=0.002", "train.warmup_steps=7", "train.optimizer=adamw8bit",
        "train.loss=chunked", "train.betas=[0.8, 0.9]", "data.num_workers=0",
        "checkpoint.every_steps=25", "checkpoint.keep_last=5"])
    cfg = train_config(job)
    assert (cfg.lr, cfg.warmup_steps, cfg.optimizer, cfg.loss, cfg.betas) == (
        0.002, 7, "adamw8bit", "chunked", (0.8, 0.9))
    assert (cfg.num_workers, cfg.checkpoint_every, cfg.keep_last) == (0, 25, 5)


def test_the_schema_has_a_key_for_every_library_field():
    train_keys = set(JobSchema.model_fields["train"].annotation.model_fields)
    for f in dataclasses.fields(TrainConfig):
        section, key = FROM_OTHER_SECTIONS.get(f.name, ("train", f.name))
        if section == "train":
            assert key in train_keys, f.name
