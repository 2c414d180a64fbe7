"""The shard loader: windows, deterministic order, rank sharding, and the cursor."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ten.data import DataError, open_data
from ten.data.loader import epoch_order


def _take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_batches_are_consecutive_windows_with_one_extra_token(cfg):
    data = open_data(cfg)  # shuffle off
    L = cfg.seq_len
    stream = torch.from_numpy(data.train.read(0, len(data.train)).astype(np.int64))
    batches = _take(data.train_loader(batch_size=4), 3)
    for b, batch in enumerate(batches):
        assert batch.shape == (4, L + 1) and batch.dtype == torch.int64
        for row in range(4):
            i = b * 4 + row
            assert torch.equal(batch[row], stream[i * L:i * L + L + 1])
    # inputs/targets: targets are inputs shifted by one, across the whole batch.
    assert torch.equal(batches[0][0, 1:], stream[1:L + 1])


def test_epochs_visit_every_example_once_in_a_seeded_order(cfg):
    data = open_data(cfg.replace(shuffle=True, seed=7))
    loader = data.train_loader(batch_size=5)
    per_epoch = loader.batches_per_epoch
    n = loader.num_examples
    L = cfg.seq_len
    batches = _take(loader, 2 * per_epoch)
    firsts = torch.cat(batches[:per_epoch])[:, 0]
    order0 = epoch_order(n, 7, 0, True)
    stream = data.train.read(0, len(data.train))
    assert firsts.tolist() == [int(stream[i * L]) for i in order0[:per_epoch * 5]]
    assert not np.array_equal(order0, epoch_order(n, 7, 1, True))
    assert np.array_equal(order0, epoch_order(n, 7, 0, True))
    assert sorted(order0.tolist()) == list(range(n))
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["position"] == 0


@pytest.mark.parametrize("workers,restore_workers", [(0, 0), (2, 0), (0, 2), (2, 2)])
def test_cursor_restores_exactly_the_next_batches(cfg, workers, restore_workers):
    data = open_data(cfg.replace(shuffle=True))
    loader = data.train_loader(batch_size=4, num_workers=workers)
    it = iter(loader)
    per_epoch = loader.batches_per_epoch
    k = per_epoch - 2  # cross an epoch boundary after restoring
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))  # survives a JSON round trip
    assert state["position"] == k and state["epoch"] == 0  # the caller's position, not prefetch
    expected = [next(it) for _ in range(5)]
    fresh = open_data(cfg.replace(shuffle=True)).train_loader(batch_size=4,
                                                               num_workers=restore_workers)
    fresh.load_state_dict(state)
    got = _take(fresh, 5)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert fresh.state_dict() == loader.state_dict()


def test_cursor_restores_in_a_new_process(cfg):
    data = open_data(cfg.replace(shuffle=True))
    loader = data.train_loader(batch_size=4, num_workers=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    expected = [next(it).sum().item() for _ in range(3)]
    code = (
        "import json, sys\n"
        "from ten.data import DataConfig, TokenizerConfig, open_data\n"
        "fields = json.loads(sys.argv[1])\n"
        "fields['tokenizer'] = TokenizerConfig(**fields['tokenizer'])\n"
        "cfg = DataConfig(**fields)\n"
        "loader = open_data(cfg).train_loader(batch_size=4, num_workers=2)\n"
        "loader.load_state_dict(json.loads(sys.argv[2]))\n"
        "it = iter(loader)\n"
        "print(json.dumps([next(it).sum().item() for _ in range(3)]))\n")
    fields = dataclasses.asdict(cfg.replace(shuffle=True))
    out = subprocess.run([sys.executable, "-c", code, json.dumps(fields), json.dumps(state)],
                         capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == expected


def test_ranks_partition_each_global_batch(cfg):
    data = open_data(cfg.replace(shuffle=True))
    whole = _take(data.train_loader(batch_size=6), 4)
    r0 = _take(data.train_loader(batch_size=3, rank=0, world_size=2), 4)
    r1 = _take(data.train_loader(batch_size=3, rank=1, world_size=2), 4)
    # world_size 2 x batch 3 reads the same examples as batch 6: rank r holds half r.
    for k in range(4):
        assert torch.equal(r0[k], whole[k][:3]) and torch.equal(r1[k], whole[k][3:])
    # ... and the cursor is the same on every rank.
    l0 = data.train_loader(batch_size=3, rank=0, world_size=2)
    l1 = data.train_loader(batch_size=3, rank=1, world_size=2)
    _take(l0, 2), _take(l1, 2)
    assert l0.state_dict() == l1.state_dict()


def test_bad_cursors_are_refused(cfg):
    data = open_data(cfg)
    loader = data.train_loader(batch_size=4)
    state = loader.state_dict()
    with pytest.raises(DataError, match="batch_size=4 but this loader has 8"):
        data.train_loader(batch_size=8).load_state_dict(state)
    with pytest.raises(DataError, match="shuffle=False but this loader has True"):
        open_data(cfg.replace(shuffle=True)).train_loader(batch_size=4).load_state_dict(state)
    with pytest.raises(DataError, match="'stream' loader"):
        loader.load_state_dict({**state, "kind": "stream"})
    with pytest.raises(DataError, match="fingerprint"):
        open_data(cfg.replace(seq_len=16)).train_loader(batch_size=4).load_state_dict(state)


def test_too_little_data_for_one_batch_is_an_error(cfg):
    data = open_data(cfg)
    with pytest.raises(DataError, match="fewer than one batch"):
        data.train_loader(batch_size=100_000)


def test_val_batches_deterministic_and_full(cfg):
    data = open_data(cfg)
    a = list(data.val_batches(batch_size=4))
    b = list(data.val_batches(batch_size=4))
    assert len(a) > 1 and all(x.shape == (4, cfg.seq_len + 1) for x in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert len(list(data.val_batches(batch_size=4, max_batches=1))) == 1
    with pytest.raises(DataError, match="validation split has .* fewer than one batch"):
        data.val_batches(batch_size=10_000)
