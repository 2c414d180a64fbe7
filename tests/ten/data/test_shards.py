"""The shard format: header, cross-shard reads, and every way a shard can go bad."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from ten.data import DataError, open_data
from ten.data.shards import HEADER_BYTES, MAGIC, SplitWriter, TokenStream, read_header, verify


def test_header_layout_and_cross_shard_reads(tmp_path):
    writer = SplitWriter(tmp_path, "train", np.dtype(np.uint16), shard_tokens=10)
    tokens = np.arange(37, dtype=np.uint16)
    writer.append(tokens[:5])
    writer.append(tokens[5:])  # one "document" longer than a shard: it just continues
    shards = writer.finish()
    assert [s["tokens"] for s in shards] == [10, 10, 10, 7]
    raw = (tmp_path / "train-000000.bin").read_bytes()
    assert raw[:8] == MAGIC and len(raw) == HEADER_BYTES + 10 * 2
    assert struct.unpack_from("<IIQ", raw, 8) == (1, 2, 10)
    assert read_header(tmp_path / "train-000003.bin") == (2, 7)
    stream = TokenStream(tmp_path, shards, "uint16")
    assert len(stream) == 37
    assert stream.read(8, 15).tolist() == list(range(8, 23))
    assert stream.read(0, 37).tolist() == list(range(37))


def test_uint32_when_vocab_exceeds_65536(tmp_path):
    writer = SplitWriter(tmp_path, "train", np.dtype(np.uint32), shard_tokens=100)
    writer.append(np.array([70000, 1, 2**31], dtype=np.uint32))
    shards = writer.finish()
    assert read_header(tmp_path / shards[0]["file"]) == (4, 3)
    assert TokenStream(tmp_path, shards, "uint32").read(0, 3).tolist() == [70000, 1, 2**31]


@pytest.fixture
def prepared(cfg):
    cfg = cfg.replace(shard_tokens=4000)
    data = open_data(cfg)
    assert len(data.manifest["splits"]["train"]["shards"]) >= 3
    return cfg, data.prepared_dir


def _verify(cfg, directory, checksums=True, tokenizer=None):
    """What open_data checks before it trusts a shard folder."""
    manifest = json.loads((directory / "manifest.json").read_text()) if tokenizer is None \
        else None
    want = tokenizer or manifest["tokenizer"]["fingerprint"]
    return verify(directory, {"tokenizer.fingerprint": want}, cfg.prepare_command(), checksums)


def _assert_names_rerun(err, cfg):
    msg = str(err.value)
    assert "\n" not in msg
    assert "python -m ten.data prepare" in msg and cfg.prepare_command() in msg


def test_truncated_shard(prepared):
    cfg, directory = prepared
    shard = directory / "train-000001.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DataError, match="truncated") as err:
        _verify(cfg, directory)
    _assert_names_rerun(err, cfg)


def test_bit_flipped_shard(prepared):
    cfg, directory = prepared
    shard = directory / "train-000001.bin"
    raw = bytearray(shard.read_bytes())
    raw[HEADER_BYTES + 100] ^= 0x04
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="sha256") as err:
        _verify(cfg, directory)
    _assert_names_rerun(err, cfg)


def test_bad_header(prepared):
    cfg, directory = prepared
    shard = directory / "val-000000.bin"
    raw = bytearray(shard.read_bytes())
    raw[0:8] = b"NOTASHRD"
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="bad header.*magic"):
        _verify(cfg, directory, checksums=False)


def test_missing_shard_and_missing_manifest(prepared):
    cfg, directory = prepared
    (directory / "train-000002.bin").unlink()
    with pytest.raises(DataError, match="missing") as err:
        _verify(cfg, directory)
    _assert_names_rerun(err, cfg)


def test_manifest_from_another_tokenizer(prepared, tmp_path):
    """Shards built with tokenizer A, restored where a job with tokenizer B looks."""
    cfg, directory = prepared
    other = cfg.replace(tokenizer=cfg.tokenizer.replace(vocab_size=420),
                        cache_dir=str(tmp_path / "other"))
    made = open_data(other)
    good, want = made.prepared_dir, made.tokenizer.fingerprint
    shutil.rmtree(good)
    shutil.copytree(directory, good)
    with pytest.raises(DataError, match="stale: tokenizer.fingerprint is") as err:
        _verify(other, good, tokenizer=want)
    _assert_names_rerun(err, other)


def test_corrupt_manifest(prepared):
    cfg, directory = prepared
    (directory / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="manifest.json is corrupt"):
        verify(directory, {}, cfg.prepare_command())


def test_manifest_records_what_the_issue_asks(prepared):
    cfg, directory = prepared
    m = json.loads((directory / "manifest.json").read_text())
    assert m["seq_len"] == cfg.seq_len and m["dtype"] == "uint16" and m["version"] == 1
    assert len(m["tokenizer"]["fingerprint"]) == 16 and len(m["source"]["fingerprint"]) == 16
    for split in m["splits"].values():
        assert split["tokens"] == sum(s["tokens"] for s in split["shards"])
        assert all(len(s["sha256"]) == 64 for s in split["shards"])


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-10])


def _flip(path):
    raw = bytearray(path.read_bytes())
    raw[HEADER_BYTES + 100] ^= 0x04
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [_truncate, _flip, lambda p: p.unlink()],
                         ids=["truncated", "bit-flipped", "missing"])
def test_a_damaged_cached_shard_is_prepared_again(prepared, damage, capfd):
    """The shard folder is the cache's own: a damaged copy is made again, not fatal."""
    cfg, directory = prepared
    before = json.loads((directory / "manifest.json").read_text())
    damage(directory / "train-000001.bin")
    data = open_data(cfg)
    assert "is damaged" in capfd.readouterr().err
    assert data.prepared_dir == directory
    assert [s["sha256"] for s in data.manifest["splits"]["train"]["shards"]] == \
        [s["sha256"] for s in before["splits"]["train"]["shards"]]
