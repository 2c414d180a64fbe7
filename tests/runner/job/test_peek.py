"""``validate`` glances at a small local corpus: what training would find after its
tokenizer and first steps is said before anything is spent, on the key to change."""

from __future__ import annotations

import json
import random

import pytest

from runner.job import JobError, load_job
from runner.job import peek as peek_module

SEED = 20261126
WORDS = "the a bucket policy object key region endpoint lease commit step token".split()


@pytest.fixture
def small(tmp_path):
    """60 documents of 40 words (seeded) and a job that trains on them."""
    rng = random.Random(SEED)
    print("corpus seed", SEED)
    with open(tmp_path / "docs.jsonl", "w") as f:
        for _ in range(60):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(40))}) + "\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"""\
name: peek
model: {{preset: tiny, d_model: 32, n_layers: 2}}
data:
  dataset: {tmp_path / 'docs.jsonl'}
  seq_len: 64
  tokenizer: {{vocab_size: 300}}
  cache_dir: {tmp_path / 'cache'}
  val_fraction: 0.1
train: {{max_steps: 3, batch_size: 4}}
""")
    return job


def problems(job, *sets):
    with pytest.raises(JobError) as err:
        load_job(job, list(sets), check_paths=True)
    return err.value.errors


def test_a_missing_text_field_is_said_on_text_field(small):
    [line] = problems(small, "data.text_field=body")
    assert line.startswith("--set data.text_field: ") and "no text field 'body'" in line
    assert "(available: ['text'])" in line


def test_a_vocabulary_the_text_cannot_fill_is_said_on_vocab_size(small):
    [line] = problems(small, "data.tokenizer.vocab_size=5000")
    assert line.startswith("--set data.tokenizer.vocab_size: ")
    assert "is more than this text can fill" in line and "at most" in line


def test_a_held_out_split_shorter_than_one_evaluation_batch_says_its_tokens(small):
    [line] = problems(small, "data.val_fraction=0.01")
    assert line.startswith("--set data.val_fraction: holds out ")
    assert "tokens: fewer than the one evaluation batch" in line
    assert "train.batch_size x data.seq_len + 1 = 257" in line


def test_a_training_split_shorter_than_one_batch_is_said_on_the_dataset(small):
    lines = problems(small, "train.batch_size=200", "data.val_fraction=0.9")
    assert any("data.dataset: the training split holds " in line and
               "fewer than one batch: train.batch_size x data.seq_len + 1 = 12,801" in line
               for line in lines), lines


def test_a_corpus_that_trains_validates_and_its_tokenizer_is_the_runs(small):
    """The glance trains the tokenizer the run would, under the run's cache key: the run
    then finds it instead of training it again."""
    from runner.job.library import data_config
    from ten.data import open_data

    job = load_job(small, check_paths=True)
    models = sorted((small.parent / "cache").rglob("*.model"))
    assert len(models) == 1
    before = models[0].stat().st_mtime_ns
    data = open_data(data_config(job))
    assert data.tokenizer.path == models[0] and models[0].stat().st_mtime_ns == before


def test_a_large_corpus_gets_its_first_record_checked_only(small, monkeypatch):
    monkeypatch.setattr(peek_module, "PEEK_BYTES", 100)
    [line] = problems(small, "data.text_field=body")
    assert "no text field 'body'" in line
    load_job(small, ["data.val_fraction=0.01"], check_paths=True)  # not read whole
    assert not list((small.parent / "cache").rglob("*.model"))


def test_the_glance_is_only_where_the_job_runs(small):
    """Without path checks (a job validated for another machine) nothing is read."""
    load_job(small, ["data.text_field=body"], check_paths=False)
    assert not (small.parent / "cache").exists()
