"""Streaming mode: same stream as the shards, cursor exact with any number of workers."""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ten.data import DataError, StreamData, open_data


def _take(loader, n):
    return list(itertools.islice(iter(loader), n))


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture
def stream_cfg(cfg):
    return cfg.replace(mode="streaming", stream_block_docs=8, stream_block_chars=2000)


def test_same_token_stream_as_pretokenized_when_unshuffled(cfg, stream_cfg):
    shards = open_data(cfg)
    given = stream_cfg.tokenizer.replace(path=str(shards.tokenizer.path))
    stream = open_data(stream_cfg.replace(tokenizer=given))
    assert isinstance(stream, StreamData) and stream.prepared_dir is None
    n = shards.train_loader(batch_size=4).batches_per_epoch
    # Two full epochs: the epoch boundary drops the same tail in both modes.
    a = _take(shards.train_loader(batch_size=4), 2 * n + 1)
    b = _take(stream.train_loader(batch_size=4, num_workers=2), 2 * n + 1)
    assert _equal(a, b)
    assert _equal(list(shards.val_batches(4)), list(stream.val_batches(4)))


def test_tokenizer_trained_from_the_stream_is_the_cached_one(cfg, stream_cfg):
    assert open_data(stream_cfg).tokenizer.path == open_data(cfg).tokenizer.path


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers,restore_workers", [(0, 2), (2, 0), (2, 1)])
def test_cursor_restores_exactly_the_next_batches(stream_cfg, shuffle, workers,
                                                  restore_workers):
    cfg = stream_cfg.replace(shuffle=shuffle)
    loader = open_data(cfg).train_loader(batch_size=3, num_workers=workers)
    it = iter(loader)
    for _ in range(23):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [next(it) for _ in range(6)]
    fresh = open_data(cfg).train_loader(batch_size=3, num_workers=restore_workers)
    fresh.load_state_dict(state)
    assert _equal(_take(fresh, 6), expected)


def test_cursor_across_an_epoch_boundary(stream_cfg):
    data = open_data(stream_cfg.replace(shuffle=True))
    loader = data.train_loader(batch_size=8, num_workers=2)
    per_epoch = sum(1 for _ in itertools.takewhile(
        lambda _: loader.state_dict()["epoch"] == 0, iter(loader)))
    loader = data.train_loader(batch_size=8, num_workers=2)
    it = iter(loader)
    for _ in range(per_epoch - 1):
        next(it)
    state = loader.state_dict()
    expected = [next(it) for _ in range(4)]
    assert loader.state_dict()["epoch"] == 1
    fresh = data.train_loader(batch_size=8, num_workers=2)
    fresh.load_state_dict(state)
    assert _equal(_take(fresh, 4), expected)
    # Epochs are reshuffled: epoch 1 does not repeat epoch 0's order.
    epoch0 = _take(data.train_loader(batch_size=8), 3)
    assert not _equal(epoch0, expected[1:4])


def test_shuffle_is_deterministic_and_seeded(stream_cfg):
    a = _take(open_data(stream_cfg.replace(shuffle=True)).train_loader(4), 5)
    b = _take(open_data(stream_cfg.replace(shuffle=True)).train_loader(4, num_workers=2), 5)
    c = _take(open_data(stream_cfg.replace(shuffle=True, seed=99)).train_loader(4), 5)
    assert _equal(a, b) and not _equal(a, c)


def test_ranks_share_one_cursor_and_split_each_group(stream_cfg):
    data = open_data(stream_cfg)
    whole = _take(data.train_loader(batch_size=4), 3)
    r0 = data.train_loader(batch_size=2, rank=0, world_size=2)
    r1 = data.train_loader(batch_size=2, rank=1, world_size=2)
    a, b = _take(r0, 3), _take(r1, 3)
    for k in range(3):
        assert torch.equal(a[k], whole[k][:2]) and torch.equal(b[k], whole[k][2:])
    assert r0.state_dict() == r1.state_dict()


def test_streams_through_the_hub_code_path(cfg, tmp_path, make_docs):
    docs = make_docs(80, seed=5)
    pq.write_table(pa.table({"text": docs}), tmp_path / "ag.parquet")
    hub = cfg.replace(dataset="ag_news", data_files=str(tmp_path / "ag.parquet"))
    shards = open_data(hub)
    stream = open_data(hub.replace(mode="streaming", stream_block_docs=8, stream_block_chars=2000))
    assert stream.tokenizer.path == shards.tokenizer.path
    assert _equal(_take(shards.train_loader(4), 10), _take(stream.train_loader(4, 2), 10))
    loader = stream.train_loader(4, num_workers=2)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    fresh = stream.train_loader(4)
    fresh.load_state_dict(state)
    assert _equal(_take(fresh, 3), [next(it) for _ in range(3)])


def test_too_short_stream_is_an_error_not_a_hang(stream_cfg):
    data = open_data(stream_cfg.replace(max_documents=3))
    with pytest.raises(DataError, match="shorter than one batch"):
        next(iter(data.train_loader(batch_size=64)))
