"""--set: one key of a mutually exclusive pair replaces the file's other key
(train.max_steps / max_tokens, data.tokenizer.path / vocab_size); the sets written into
the file a submitted job runs."""

from __future__ import annotations

import pytest

from runner.job import JobError, parse_job
from runner.job.load import EXCLUSIVE
from runner.job.schema import JobSchema

WITH_VOCAB = """\
name: t
model: {arch: ten, preset: tiny}
data: {dataset: builtin:botocore-docs, tokenizer: {vocab_size: 512}}
train: {max_steps: 10}
"""
WITH_PATH = WITH_VOCAB.replace("vocab_size: 512", "path: ./tok.model")


def test_set_tokenizer_path_replaces_the_files_vocab_size():
    job = parse_job(WITH_VOCAB, sets=["data.tokenizer.path=x.model"])
    tok = job.data.tokenizer
    assert tok.path == "x.model" and "vocab_size" not in tok.model_fields_set


def test_set_vocab_size_replaces_the_files_tokenizer_path():
    job = parse_job(WITH_PATH, sets=["data.tokenizer.vocab_size=1000"])
    assert (job.data.tokenizer.path, job.data.tokenizer.vocab_size) == (None, 1000)


def test_set_budget_still_replaces_the_files_budget_both_ways():
    job = parse_job(WITH_VOCAB, sets=["train.max_tokens=100000"])
    assert (job.train.max_steps, job.train.max_tokens) == (None, 100000)
    back = parse_job(WITH_VOCAB.replace("max_steps: 10", "max_tokens: 100000"),
                     sets=["train.max_steps=3"])
    assert (back.train.max_steps, back.train.max_tokens) == (3, None)


def test_setting_null_clears_without_dropping_the_other():
    job = parse_job(WITH_VOCAB, sets=["data.tokenizer.path=null"])
    assert job.data.tokenizer.vocab_size == 512
    job = parse_job(WITH_VOCAB.replace("max_steps: 10", "max_steps: 10, max_tokens: null"),
                    sets=["train.max_tokens=null"])
    assert job.train.max_steps == 10


def test_both_given_on_the_command_line_is_still_an_error():
    with pytest.raises(JobError) as info:
        parse_job(WITH_VOCAB.replace(", tokenizer: {vocab_size: 512}", ""),
                  sets=["data.tokenizer.path=x.model", "data.tokenizer.vocab_size=100"])
    assert info.value.errors == ["--set data.tokenizer.vocab_size: give either tokenizer.path "
                                 "or tokenizer.vocab_size, not both (the .model file fixes the "
                                 "vocabulary)"]


def test_both_in_the_file_is_still_an_error():
    with pytest.raises(JobError, match="give either tokenizer.path or tokenizer.vocab_size"):
        parse_job(WITH_VOCAB.replace("vocab_size: 512", "vocab_size: 512, path: a.model"))


def test_exclusive_pairs_name_real_keys():
    from runner.job.errors import section_fields

    for pair in EXCLUSIVE:
        for path in pair:
            assert path[-1] in section_fields(JobSchema, path[:-1]), path


def test_the_file_a_submit_with_sets_runs_holds_them_and_comments_stay_comments():
    """submit --set writes the overrides into the job's YAML: what a set says in the
    header stays on its comment line whatever it holds."""
    from runner.job.load import with_sets

    text = with_sets(WITH_VOCAB, ["train.max_steps=7", "data.text_field=a\nb"],
                     "job\nname: evil.yaml")
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header == ['# "job\\nname: evil.yaml", with', '# --set "train.max_steps=7"',
                      '# --set "data.text_field=a\\nb"']
    job = parse_job(text, check_model=False)
    assert (job.train.max_steps, job.data.text_field) == (7, "a b")
    assert with_sets(WITH_VOCAB, [], "job.yaml") == WITH_VOCAB  # comments and all
