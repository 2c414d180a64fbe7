"""The seam between a job and the library: one declaration of each training setting
(ten.config.TrainConfig), the job's train section built from it, and the library's
configs built from a job by field name."""

import dataclasses

from runhelpers import MINIMAL_JOB

from runner.job import parse_job
from runner.job.library import FROM_OTHER_SECTIONS, train_config
from runner.job.schema import JobSchema
from ten.config import TrainConfig

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


def test_the_train_section_is_built_from_the_library_declaration():
    """One declaration: each TrainConfig field is a train key (or lives where
    FROM_OTHER_SECTIONS says) with the field's default, description and bounds."""
    import typing

    import pytest

    from runner.job import JobError
    from ten.config import Doc, FieldError

    train = JobSchema.model_fields["train"].annotation.model_fields
    hints = typing.get_type_hints(TrainConfig, include_extras=True)
    for f in dataclasses.fields(TrainConfig):
        if f.name in FROM_OTHER_SECTIONS:
            assert f.name not in train
            continue
        doc = next(m for m in hints[f.name].__metadata__ if isinstance(m, Doc))
        assert (train[f.name].default, train[f.name].description) == (f.default, doc)
    # a bound, said by the job layer on the key and by the library on the field
    with pytest.raises(JobError) as err:
        parse_job(MINIMAL, check_model=False, sets=["train.batch_size=0"])
    assert err.value.errors == ["--set train.batch_size: must be >= 1, got 0"]
    with pytest.raises(FieldError, match="batch_size: must be >= 1, got 0"):
        TrainConfig(max_steps=10, batch_size=0)
