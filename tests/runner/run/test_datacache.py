"""Prepared data through a real bucket (moto): whatever a machine has and did not fetch
is published, so the next machine fetches instead of tokenizing; a corrupt tokenizer in
the bucket is not used."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from runner.run.datacache import BucketDataCache
from runner.storage.datasets import is_committed, upload_dataset


@pytest.fixture
def cfg(tmp_path):
    from ten.data import DataConfig, TokenizerConfig

    rng = random.Random(3)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7)))
             for _ in range(300)]
    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w") as f:
        for _ in range(200):
            f.write(json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(5, 60)))})
                    + "\n")
    return DataConfig(dataset=str(corpus), seq_len=16, num_proc=1,
                      tokenizer=TokenizerConfig(vocab_size=300),
                      val_fraction=0.1, shuffle=False, progress=False,
                      cache_dir=str(tmp_path / "machine1"))


def _open(cfg, store):
    """open_data through the bucket, as the runner does; waits for the uploads."""
    from ten.data import open_data

    lines: list[str] = []
    cache = BucketDataCache(store, lines.append)
    data = open_data(cfg, cache=cache)
    for thread in cache.threads:
        thread.join(timeout=60)
    return data, cache, lines


@pytest.fixture
def no_tokenizing(monkeypatch):
    """Tripwires: training a tokenizer or tokenizing shards fails the test."""
    from ten.data import prepare, tokenizer

    def tripped(*args, **kwargs):
        raise AssertionError("tokenized on a machine that should have fetched")

    monkeypatch.setattr(tokenizer, "train", tripped)
    monkeypatch.setattr(prepare, "_prepare_pretokenized", tripped)


def _keys(data):
    return (f"tokenizer-{data.tokenizer.path.parent.name}", f"shards-{data.fingerprint}")


def test_prepared_without_a_bucket_is_published_later(cfg, tmp_path, s3_store, request):
    from ten.data import open_data

    store = s3_store("moto")
    local = open_data(cfg)  # tried locally first: no store at all
    data, cache, lines = _open(cfg, store)  # the same machine, now with the bucket
    assert data.fingerprint == local.fingerprint
    assert all(is_committed(store, key) for key in _keys(data)), lines
    assert sum("shared in" in line for line in lines) == 2

    again, cache, lines = _open(cfg, store)  # already there: nothing uploaded again
    assert not any("shared in" in line for line in lines)

    request.getfixturevalue("no_tokenizing")  # a second machine: empty disk, same bucket
    other, cache, lines = _open(cfg.replace(cache_dir=str(tmp_path / "machine2")), store)
    assert sum("downloaded from" in line for line in lines) == 2, lines
    assert cache.threads == []  # fetched: no publish, not even a HEAD
    assert other.train.read(0, len(other.train)).tolist() == \
        local.train.read(0, len(local.train)).tolist()


def test_a_corrupt_tokenizer_in_the_bucket_is_not_used(cfg, tmp_path, s3_store, capsys):
    from ten.data import open_data

    store = s3_store("moto")
    local = open_data(cfg)
    key = _keys(local)[0]
    # Uploaded from a machine whose disk had flipped a bit after training: the bucket's
    # own sha256 matches the bad bytes, only the tokenizer's checksum does not.
    bad_dir = tmp_path / "bad"
    shutil.copytree(local.tokenizer.path.parent, bad_dir)
    model = bad_dir / "tokenizer.model"
    raw = bytearray(model.read_bytes())
    raw[len(raw) // 2] ^= 0x02
    model.write_bytes(bytes(raw))
    assert upload_dataset(store, key, bad_dir)
    capsys.readouterr()
    other, _, lines = _open(cfg.replace(cache_dir=str(tmp_path / "machine2")), store)
    assert f"the tokenizer fetched for {key} fails its sha256 check" in capsys.readouterr().err
    assert other.tokenizer.path.read_bytes() == local.tokenizer.path.read_bytes()
    assert other.fingerprint == local.fingerprint
