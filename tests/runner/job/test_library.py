"""The seam between a job and the library: one declaration of each training setting
(ten.config.TrainConfig), the job's train section built from it, and the library's
configs built from a job by field name."""

import dataclasses

import pytest
from runhelpers import MINIMAL_JOB

from runner.job import parse_job
from runner.job.library import train_config
from runner.job.schema import JobSchema
from runner.keys import FROM_OTHER_SECTIONS
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


def test_the_data_section_is_built_from_the_library_declaration():
    """DataConfig's fields are the data keys, the tokenizer nested on both sides, less
    the knobs a job does not turn; the job adds num_workers and its own stricter bounds."""
    from ten.data.config import DataConfig, TokenizerConfig

    data = JobSchema.model_fields["data"].annotation.model_fields
    exposed = {f.name for f in dataclasses.fields(DataConfig)} - {
        "seed", "shard_tokens", "verify_checksums", "stream_block_docs",
        "stream_block_chars", "progress"}
    assert set(data) == exposed | {"num_workers"}
    tokenizer = data["tokenizer"].annotation.model_fields
    assert {k: v.default for k, v in tokenizer.items()} == dataclasses.asdict(TokenizerConfig())
    assert data["dataset"].is_required() and data["seq_len"].default == DataConfig().seq_len


def test_a_jobs_data_keys_reach_the_library_under_their_own_names():
    from runner.job.library import data_config
    from ten.data.config import DataConfig, TokenizerConfig

    job = parse_job(MINIMAL, check_model=False, sets=[
        "data.dataset=corpus.jsonl", "data.mode=streaming", "data.seq_len=64",
        "data.tokenizer.vocab_size=500", "data.tokenizer.type=unigram",
        "data.tokenizer.sample_chars=5000", "data.val_fraction=0.2", "train.seed=7",
        "data.max_documents=9"])
    assert data_config(job) == DataConfig(
        dataset="corpus.jsonl", mode="streaming", seq_len=64, seed=7, val_fraction=0.2,
        max_documents=9, tokenizer=TokenizerConfig(vocab_size=500, type="unigram",
                                                   sample_chars=5000))


@pytest.mark.parametrize("said, shown", [
    ("set DataConfig.text_field", "set data.text_field"),
    ("DataConfig.tokenizer.path or", "data.tokenizer.path or"),
    ("TokenizerConfig.vocab_size: must be >= 8", "data.tokenizer.vocab_size: must be >= 8"),
    ("lower TrainConfig.batch_size (raise TrainConfig.grad_accum)",
     "lower train.batch_size (raise train.grad_accum)"),
    ("TrainConfig.checkpoint_every", "checkpoint.every_steps"),
    ("TENConfig.scan_backend to chunked", "model.scan_backend to chunked"),
    ("TransformerConfig.grad_checkpointing", "model.grad_checkpointing"),
    ("lower DataConfig.seq_len (now 512).", "lower data.seq_len (now 512)."),
    ("DataConfig.seed", "train.seed"),
    ("DataConfig.shard_tokens is library-only", "DataConfig.shard_tokens is library-only"),
])
def test_the_librarys_field_names_are_shown_as_job_keys(said, shown):
    from runner.keys import in_job_terms

    assert in_job_terms(said) == shown


def test_a_data_error_is_said_in_job_keys_by_a_run():
    """The path a run's data error takes to the log: the library's field, the job's key."""
    from pathlib import Path

    from runner.run.failures import exit_code_of
    from ten.data import DataError

    lines = []
    code = exit_code_of(DataError("no text; set DataConfig.text_field"), None, Path("."),
                        False, lines.append)
    assert (int(code), lines) == (3, ["data error: no text; set data.text_field"])


def test_the_sequence_warm_up_is_checked_against_the_jobs_seq_len():
    from runner.job import JobError

    job = parse_job(MINIMAL, check_model=False, sets=[
        "data.seq_len=256", "train.seq_warmup_start=64", "train.seq_warmup_steps=100"])
    cfg = train_config(job)
    assert (cfg.seq_warmup_start, cfg.seq_warmup_steps) == (64, 100)
    for sets, said in (
            (["train.seq_warmup_start=96", "train.seq_warmup_steps=100"],
             "--set train.seq_warmup_start: must be data.seq_len (256) over a power of two "
             "(e.g. 64), got 96"),
            (["train.seq_warmup_start=64"],
             "train.seq_warmup_steps: must be >= 1 with seq_warmup_start (the steps the "
             "warm-up lasts)")):
        with pytest.raises(JobError) as err:
            parse_job(MINIMAL, check_model=False, sets=["data.seq_len=256", *sets])
        [line] = err.value.errors
        assert line.endswith(said), line
